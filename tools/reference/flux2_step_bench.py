#!/usr/bin/env python3
"""diffusers' Flux2 denoising step against ours (bench_flux2's tp=1 row), same model, same threads,
in one run.

    tools/reference/.venv/bin/python tools/reference/flux2_step_bench.py [--bench build/bin/bench_flux2]
        [--threads T] [--reps N]

The model is bench_flux2's (bench/flux2.cc, BenchConfig): diffusers.Flux2Transformer2DModel with
D = 512 (4 heads x 128), 4 double + 8 single blocks, mlp_ratio 3, in_channels 64, joint dim 512,
guidance embedding on, RoPE axes [32, 32, 32, 32]; random f32 weights (nothing is downloaded).
One step is what bench_flux2 times: the transformer's forward on 256 image tokens (a 16 x 16
latent grid) + 64 text tokens, batch 1, guidance 4, at the first of 4 timesteps of FLUX.2's
scheduler, then FlowMatchEulerDiscreteScheduler.step; eager PyTorch under torch.no_grad(), as
Flux2Pipeline runs it. T defaults to os.cpu_count(), what bench_flux2's oneTBB arena uses;
torch.set_num_threads(T).

The two sides take turns, twice (diffusers, ours, diffusers, ours; diffusers' figure the median of
--reps steps after two warm-up steps, ours bench_flux2's median), and each side's faster pass is
compared: a machine whose speed drifts (a shared VM) favours neither. Ends with
    RESULT flux2_step_vs_diffusers <ours / diffusers> 0.8 PASS|FAIL
(the target: our step at most 0.8x diffusers' time).
"""
import os
import re
import subprocess
import sys

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel
from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline, compute_empirical_mu

from bench_util import bench_parser, median_seconds

CONFIG = dict(patch_size=1, in_channels=64, out_channels=None, num_layers=4, num_single_layers=8,
              attention_head_dim=128, num_attention_heads=4, joint_attention_dim=512,
              timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=[32, 32, 32, 32],
              rope_theta=2000, eps=1e-6, guidance_embeds=True)
SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                 max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096,
                 time_shift_type="exponential")
IMAGE, TEXT, STEPS = (16, 16), 64, 4


def diffusers_step_ms(reps):
    torch.manual_seed(0)
    model = Flux2Transformer2DModel(**CONFIG).eval()  # f32 parameters
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) / max(p.shape[-1], 1) ** 0.5 if p.dim() > 1 else 0.5 + torch.rand_like(p))
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, CONFIG["in_channels"], *IMAGE, generator=g)
    img_ids = Flux2Pipeline._prepare_latent_ids(latents).to(torch.float32)
    x = Flux2Pipeline._pack_latents(latents)
    prompt = torch.randn(1, TEXT, CONFIG["joint_attention_dim"], generator=g)
    txt_ids = Flux2Pipeline._prepare_text_ids(prompt).to(torch.float32)
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER)
    scheduler.set_timesteps(STEPS, mu=compute_empirical_mu(IMAGE[0] * IMAGE[1], STEPS))
    t = scheduler.timesteps[0]
    guidance = torch.tensor([4.0])

    def step():
        scheduler._step_index = None  # every timed step is the first one
        with torch.no_grad():
            v = model(hidden_states=x, encoder_hidden_states=prompt, timestep=(t / 1000).expand(1),
                      img_ids=img_ids, txt_ids=txt_ids, guidance=guidance, return_dict=False)[0]
            out = scheduler.step(v, t, x, return_dict=False)[0]
        assert torch.isfinite(out).all()

    ms = median_seconds(step, reps, warmup=2) * 1e3
    return ms, sum(p.numel() for p in model.parameters())


def ours_step_ms(bench):
    out = subprocess.run([bench, "--quick", "--no-processes"], capture_output=True, text=True, check=True)
    sys.stdout.write(out.stdout)
    m = re.search(r"^tp=1\s+([\d.]+)", out.stdout, re.M)
    if not m:
        raise SystemExit(f"no tp=1 row in {bench}'s output")
    return float(m.group(1))


def main():
    args = bench_parser(__doc__, "bench_flux2", 5, threads=os.cpu_count()).parse_args()
    torch.set_num_threads(args.threads)
    print(f"flux2_step_bench: torch {torch.__version__}, diffusers "
          f"{__import__('diffusers').__version__}, {args.threads} threads on each side")
    t1, params = diffusers_step_ms(args.reps)
    o1 = ours_step_ms(args.bench)
    t2, _ = diffusers_step_ms(args.reps)
    o2 = ours_step_ms(args.bench)
    ours, theirs = min(o1, o2), min(t1, t2)
    print(f"\nFlux2 step, D=512, 4 double + 8 single blocks, {IMAGE[0] * IMAGE[1]} + {TEXT} tokens, "
          f"f32, {params / 1e6:.1f}M parameters, {args.threads} threads each")
    print(f"{'':12} {'step ms':>9}")
    print(f"{'ours':12} {ours:9.1f}   (passes {o1:.1f}, {o2:.1f})")
    print(f"{'diffusers':12} {theirs:9.1f}   (passes {t1:.1f}, {t2:.1f})")
    ratio = ours / theirs
    print(f"RESULT flux2_step_vs_diffusers {ratio:.2f} 0.8 {'PASS' if ratio <= 0.8 else 'FAIL'}")


if __name__ == "__main__":
    main()
