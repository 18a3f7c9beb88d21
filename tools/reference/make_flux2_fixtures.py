#!/usr/bin/env python3
"""Golden fixtures for the Flux2 tests: tiny random diffusers.Flux2Transformer2DModel checkpoints,
what diffusers computes with them, and the Flux2 pipeline's flow-matching schedule.

    /work/refvenv/bin/python tools/reference/make_flux2_fixtures.py [--out tests/fixtures]

(any venv with torch, diffusers >= 0.42, safetensors and numpy will do; run from the repo root).
Everything runs on the CPU in float32 with fixed seeds and one thread, so a rerun writes the
same bytes. Weights are random: Linear weights N(0, 1/fan_in), the QK RMSNorm weights 0.5 + U(0, 1)
so that a missing or misplaced norm weight shows; Flux2 has no biases.

It writes, under --out:
  flux2-tiny/        config.json + diffusion_pytorch_model.safetensors (f32), save_pretrained's
                     own output. D=64 (4 heads x 16), 2 double + 2 single blocks, M=192, joint dim
                     24, guidance embedding on, RoPE axes [4,4,4,4] (so rope_theta matters). Heads and M divide by 1, 2, 4.
    inputs.safetensors   hidden_states [2,24,16] (a 4x6 latent grid), encoder_hidden_states
                         [2,7,24], timestep [2] (t/1000, as the pipeline passes it), guidance [2],
                         img_ids [2,24,4] / txt_ids [2,7,4] as Flux2Pipeline builds them (stored f32)
    outputs.safetensors  sample [2,24,16]; also temb [2,32] (timestep + guidance embedding) and
                         rope_cos / rope_sin [31,8] (text rows first, then image rows) to help
                         localize a mismatch
  flux2-pipe/        a pipeline directory: model_index.json (Flux2Pipeline: transformer +
                     scheduler only), scheduler/scheduler_config.json (FlowMatchEulerDiscreteScheduler
                     with FLUX.2-dev's settings, written by save_config), transformer/ with
                     config.json and bf16 weights in two shards + diffusion_pytorch_model.safetensors
                     .index.json. D=48 (6 heads x 8), 1 double + 2 single blocks, M=120, joint dim
                     20, no guidance embedding. Heads and M divide by 1, 2, 3, 6.
    inputs.safetensors   hidden_states [1,16,16] (4x4 grid), encoder_hidden_states [1,5,20],
                         timestep [1], img_ids, txt_ids (no guidance)
    outputs.safetensors  sample [1,16,16] from the model loaded back from the bf16 shards in f32
                         (so the golden is exact for the rounded weights)
    trajectory.safetensors  3 steps of Flux2Pipeline.__call__'s denoising loop with the real
                         scheduler: latents_0..latents_3 [1,16,16], noise_pred_0..2, prompt_embeds,
                         img_ids, txt_ids, sigmas [4] (incl. the final 0), timesteps [3], mu [1] f64
  flux2-scheduler.json  a list, one object per (image_seq_len, steps) with the scheduler of
                     flux2-pipe/scheduler: mu (the pipeline's compute_empirical_mu), scheduler.sigmas (steps+1, incl. the final 0) and
                     scheduler.timesteps (steps), float32 values written as exact Python floats
"""
import argparse
import json
import os

import numpy as np
import torch
from safetensors.torch import save_file

import diffusers
from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel
from diffusers.pipelines.flux2.pipeline_flux2 import (Flux2Pipeline, compute_empirical_mu,
                                                      retrieve_timesteps)

TINY_CONFIG = dict(patch_size=1, in_channels=16, out_channels=None, num_layers=2,
                   num_single_layers=2, attention_head_dim=16, num_attention_heads=4,
                   joint_attention_dim=24, timestep_guidance_channels=32, mlp_ratio=3.0,
                   axes_dims_rope=[4, 4, 4, 4], rope_theta=2000, eps=1e-6, guidance_embeds=True)

PIPE_CONFIG = dict(patch_size=1, in_channels=16, out_channels=None, num_layers=1,
                   num_single_layers=2, attention_head_dim=8, num_attention_heads=6,
                   joint_attention_dim=20, timestep_guidance_channels=32, mlp_ratio=2.5,
                   axes_dims_rope=[2, 2, 2, 2], rope_theta=2000, eps=1e-6, guidance_embeds=False)

# FLUX.2-dev's scheduler settings; everything not named keeps the class default.
SCHEDULER_CONFIG = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                        base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                        max_image_seq_len=4096, time_shift_type="exponential")

SCHEDULE_CASES = [(16, 3), (24, 4), (256, 4), (1024, 28), (4096, 50), (4300, 10), (4301, 10),
                  (6000, 28)]

TRAJECTORY_STEPS = 3


def randomize(model, seed):
    """Random weights at a scale that keeps activations O(1) through the blocks."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # the only 1-D parameters are the QK RMSNorm weights
                assert "norm" in name, name
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def build_model(config, seed):
    torch.manual_seed(seed)
    model = Flux2Transformer2DModel(**config).to(torch.float32).eval()
    randomize(model, seed)
    return model


def latent_grid(g, batch, channels, height, width):
    """A random latent in the pipeline's [B, C, H, W] layout, packed to [B, H*W, C], and its ids."""
    latents = torch.randn(batch, channels, height, width, generator=g)
    ids = Flux2Pipeline._prepare_latent_ids(latents)
    return Flux2Pipeline._pack_latents(latents), ids.to(torch.float32)


def text_ids(prompt_embeds):
    return Flux2Pipeline._prepare_text_ids(prompt_embeds).to(torch.float32)


def forward(model, inputs):
    with torch.no_grad():
        return model(hidden_states=inputs["hidden_states"],
                     encoder_hidden_states=inputs["encoder_hidden_states"],
                     timestep=inputs["timestep"], img_ids=inputs["img_ids"],
                     txt_ids=inputs["txt_ids"], guidance=inputs.get("guidance"),
                     return_dict=False)[0]


def check_sample(name, sample):
    std, amax = float(sample.std()), float(sample.abs().max())
    assert torch.isfinite(sample).all(), name
    assert 0.1 < std < 10.0, f"{name}: std(sample) = {std}"
    print(f"{name}: sample {list(sample.shape)} std {std:.4f} max|.| {amax:.4f}")
    return std, amax


def check_every_weight_matters(name, model, inputs, reference):
    """Nudging one element of any parameter tensor must change the output: catches a weight the
    forward never reads (e.g. an embedder that is skipped) and a weight scale that saturates."""
    params = dict(model.named_parameters())
    g = torch.Generator().manual_seed(0)
    smallest = None
    for pname, p in params.items():
        idx = int(torch.randint(p.numel(), (1,), generator=g))
        with torch.no_grad():
            flat = p.view(-1)
            old = flat[idx].clone()
            flat[idx] = old + 0.1
            diff = float((forward(model, inputs) - reference).abs().max())
            flat[idx] = old
        assert diff > 1e-5, f"{name}: {pname}[{idx}] does not affect the output ({diff})"
        smallest = diff if smallest is None else min(smallest, diff)
    assert torch.equal(forward(model, inputs), reference)
    print(f"{name}: every one of {len(params)} parameter tensors affects sample "
          f"(smallest change {smallest:.2e})")


def make_tiny(out):
    d = os.path.join(out, "flux2-tiny")
    os.makedirs(d, exist_ok=True)
    model = build_model(TINY_CONFIG, seed=2024)
    model.save_pretrained(d, safe_serialization=True)

    g = torch.Generator().manual_seed(7)
    hidden_states, img_ids = latent_grid(g, 2, 16, 4, 6)  # [2, 24, 16], [2, 24, 4]
    encoder_hidden_states = torch.randn(2, 7, 24, generator=g)
    inputs = dict(hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states,
                  timestep=torch.tensor([0.73, 0.31], dtype=torch.float32),
                  guidance=torch.tensor([4.0, 2.5], dtype=torch.float32),
                  img_ids=img_ids, txt_ids=text_ids(encoder_hidden_states))
    sample = forward(model, inputs)

    with torch.no_grad():
        temb = model.time_guidance_embed(inputs["timestep"] * 1000, inputs["guidance"] * 1000)
        txt_cos, txt_sin = model.pos_embed(inputs["txt_ids"][0])
        img_cos, img_sin = model.pos_embed(inputs["img_ids"][0])
    outputs = dict(sample=sample, temb=temb, rope_cos=torch.cat([txt_cos, img_cos]),
                   rope_sin=torch.cat([txt_sin, img_sin]))

    # The saved checkpoint reproduces the model.
    reloaded = Flux2Transformer2DModel.from_pretrained(d, torch_dtype=torch.float32).eval()
    assert torch.equal(forward(reloaded, inputs), sample)
    check_every_weight_matters("flux2-tiny", model, inputs, sample)

    save_file({k: v.contiguous() for k, v in inputs.items()}, os.path.join(d, "inputs.safetensors"))
    save_file({k: v.contiguous() for k, v in outputs.items()}, os.path.join(d, "outputs.safetensors"))
    return check_sample("flux2-tiny", sample)


def scheduler_from(dirname):
    return FlowMatchEulerDiscreteScheduler.from_pretrained(dirname, subfolder="scheduler")


def set_pipeline_schedule(scheduler, image_seq_len, steps):
    """Flux2Pipeline.__call__'s step 6, with the default (None) sigmas argument."""
    sigmas = np.linspace(1.0, 1 / steps, steps)
    mu = compute_empirical_mu(image_seq_len=image_seq_len, num_steps=steps)
    timesteps, _ = retrieve_timesteps(scheduler, steps, "cpu", sigmas=sigmas, mu=mu)
    return timesteps, mu


def make_pipe(out):
    d = os.path.join(out, "flux2-pipe")
    tdir = os.path.join(d, "transformer")
    os.makedirs(tdir, exist_ok=True)

    with open(os.path.join(d, "model_index.json"), "w") as f:
        json.dump({"_class_name": "Flux2Pipeline", "_diffusers_version": diffusers.__version__,
                   "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
                   "transformer": ["diffusers", "Flux2Transformer2DModel"]},
                  f, indent=2, sort_keys=True)
        f.write("\n")
    FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG).save_config(os.path.join(d, "scheduler"))

    model = build_model(PIPE_CONFIG, seed=4242).to(torch.bfloat16)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # A shard limit a bit over half the total gives exactly two shards.
    model.save_pretrained(tdir, safe_serialization=True, max_shard_size=int(nbytes * 0.6))
    with open(os.path.join(tdir, "diffusion_pytorch_model.safetensors.index.json")) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    assert len(shards) == 2, shards

    # Everything below uses the model as a reader of these files gets it: bf16 weights widened to f32.
    model = Flux2Transformer2DModel.from_pretrained(d, subfolder="transformer",
                                                    torch_dtype=torch.float32).eval()
    assert all(p.dtype == torch.float32 for p in model.parameters())

    g = torch.Generator().manual_seed(11)
    hidden_states, img_ids = latent_grid(g, 1, 16, 4, 4)  # [1, 16, 16], [1, 16, 4]
    encoder_hidden_states = torch.randn(1, 5, 20, generator=g)
    inputs = dict(hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states,
                  timestep=torch.tensor([0.6], dtype=torch.float32), img_ids=img_ids,
                  txt_ids=text_ids(encoder_hidden_states))
    sample = forward(model, inputs)
    check_every_weight_matters("flux2-pipe", model, inputs, sample)
    save_file({k: v.contiguous() for k, v in inputs.items()}, os.path.join(d, "inputs.safetensors"))
    save_file({"sample": sample.contiguous()}, os.path.join(d, "outputs.safetensors"))
    stats = check_sample("flux2-pipe", sample)

    # The denoising loop of Flux2Pipeline.__call__ (no condition images, guidance unused since the
    # model has no guidance embedder, so passed as None).
    g = torch.Generator().manual_seed(12)
    latents, latent_ids = latent_grid(g, 1, 16, 4, 4)
    prompt_embeds = torch.randn(1, 5, 20, generator=g)
    txt = text_ids(prompt_embeds)
    scheduler = scheduler_from(d)
    timesteps, mu = set_pipeline_schedule(scheduler, latents.shape[1], TRAJECTORY_STEPS)
    scheduler.set_begin_index(0)
    traj = dict(latents_0=latents.clone(), prompt_embeds=prompt_embeds, img_ids=latent_ids,
                txt_ids=txt, sigmas=scheduler.sigmas.clone(), timesteps=timesteps.clone(),
                mu=torch.tensor([mu], dtype=torch.float64))
    for i, t in enumerate(timesteps):
        timestep = t.expand(latents.shape[0]).to(latents.dtype)
        with torch.no_grad():
            noise_pred = model(hidden_states=latents, timestep=timestep / 1000, guidance=None,
                               encoder_hidden_states=prompt_embeds, txt_ids=txt,
                               img_ids=latent_ids, return_dict=False)[0]
        noise_pred = noise_pred[:, :latents.size(1):]
        latents = scheduler.step(noise_pred, t, latents, return_dict=False)[0]
        traj[f"noise_pred_{i}"] = noise_pred
        traj[f"latents_{i + 1}"] = latents
    assert traj["sigmas"].shape == (TRAJECTORY_STEPS + 1,) and float(traj["sigmas"][-1]) == 0.0
    save_file({k: v.contiguous() for k, v in traj.items()},
              os.path.join(d, "trajectory.safetensors"))
    print(f"flux2-pipe trajectory: mu {mu!r} sigmas {traj['sigmas'].tolist()} "
          f"timesteps {traj['timesteps'].tolist()}")
    for i in range(TRAJECTORY_STEPS):
        print(f"  step {i}: std(noise_pred) {float(traj[f'noise_pred_{i}'].std()):.4f} "
              f"std(latents_{i + 1}) {float(traj[f'latents_{i + 1}'].std()):.4f}")
    return stats, traj


def make_schedules(out, pipe_dir):
    cases = []
    for image_seq_len, steps in SCHEDULE_CASES:
        scheduler = scheduler_from(pipe_dir)
        timesteps, mu = set_pipeline_schedule(scheduler, image_seq_len, steps)
        assert scheduler.sigmas.dtype == torch.float32 and timesteps.dtype == torch.float32
        cases.append(dict(image_seq_len=image_seq_len, steps=steps, mu=mu,
                          sigmas=[float(x) for x in scheduler.sigmas.tolist()],
                          timesteps=[float(x) for x in timesteps.tolist()]))
    with open(os.path.join(out, "flux2-scheduler.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, diffusers {diffusers.__version__}, numpy {np.__version__}")
    make_tiny(args.out)
    make_pipe(args.out)
    make_schedules(args.out, os.path.join(args.out, "flux2-pipe"))


if __name__ == "__main__":
    main()
