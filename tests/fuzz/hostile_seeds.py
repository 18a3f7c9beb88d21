#!/usr/bin/env python3
"""Writes the hand-made hostile seeds of the fuzz corpora (tests/fuzz/corpus/<target>/hostile-*).

Each file is one case of issue 45 that the readers must refuse by name (the same cases are tests in
tests/loaders/: GgufFinite.*, GgufFiles.*, GgufLlama.*, Safetensors.NonFinite*, HfConfig.Errors);
here they seed the fuzzers and replay through <target>_replay on every test run. Plain Python, no
packages: python3 tests/fuzz/hostile_seeds.py (rewrites the files; they are committed).
"""
import json
import os
import struct

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

U32, F32, STRING, U64 = 4, 6, 8, 10  # GGUF value types
F16_TYPE, Q8_0, Q4_K = 1, 8, 12       # ggml types


def gguf(kvs, tensors, data):
    """kvs: [(key, type, value)]; tensors: [(name, [ne...], ggml type, offset)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, typ, value in kvs:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", typ)
        if typ == STRING:
            out += struct.pack("<Q", len(value)) + value.encode()
        elif typ == F32:
            out += struct.pack("<f", value)
        elif typ == U32:
            out += struct.pack("<I", value)
        else:
            out += struct.pack("<Q", value)
    for name, ne, typ, offset in tensors:
        out += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(ne))
        out += b"".join(struct.pack("<Q", n) for n in ne) + struct.pack("<IQ", typ, offset)
    out += b"\0" * (-len(out) % 32)
    return out + data


def llama(extra, hidden=8, heads=2):
    return [("general.architecture", STRING, "llama"), ("llama.vocab_size", U32, 32),
            ("llama.block_count", U32, 1), ("llama.embedding_length", U32, hidden),
            ("llama.feed_forward_length", U32, 16), ("llama.attention.head_count", U32, heads)] + extra


def q8_0_blocks(n, bad=None):
    """n Q8_0 blocks of scale 0.01 (f16 0x211F) and quants 1..32; block `bad` gets d = NaN."""
    out = b""
    for b in range(n):
        out += struct.pack("<H", 0x7E00 if b == bad else 0x211F) + bytes(range(1, 33))
    return out


def q4_0_blocks(n):
    """n Q4_0 blocks (scale 0.01, quants from a fixed pseudo-random sequence): Q4_0 and Q4_K take
    the same bytes per element, so 8 of them pass for one Q4_K block."""
    out = b""
    for b in range(n):
        out += struct.pack("<H", 0x211F) + bytes((((b * 16 + i) * 2654435761) >> 11) & 0xFF for i in range(16))
    return out


def safetensors(name, dtype, shape, data):
    header = json.dumps({name: {"dtype": dtype, "shape": shape, "data_offsets": [0, len(data)]}}).encode()
    return struct.pack("<Q", len(header)) + header + data


def write(target, name, data):
    path = os.path.join(CORPUS, target, "hostile-" + name)
    with open(path, "wb") as f:
        f.write(data)


f16_inf_row = struct.pack("<8H", *([0x3C00] * 5 + [0x7C00] + [0x3C00] * 2))
seeds = {
    "gguf_fuzz": {
        "nan-scale-q8_0.gguf": gguf([], [("w", [64, 2], Q8_0, 0)], q8_0_blocks(4, bad=3)),
        "inf-f16-element.gguf": gguf([], [("w", [8, 2], F16_TYPE, 0)], struct.pack("<8H", *[0x3C00] * 8) + f16_inf_row),
        "q4_0-bytes-as-q4_k.gguf": gguf([], [("w", [256, 16], Q4_K, 0)], q4_0_blocks(16 * 8)),
        "rope-freq-base-inf.gguf": gguf(llama([("llama.rope.freq_base", F32, float("inf"))]), [], b""),
        "rms-eps-nan.gguf": gguf(llama([("llama.attention.layer_norm_rms_epsilon", F32, float("nan"))]), [], b""),
        "head-dim-not-divisible.gguf": gguf(llama([], hidden=10, heads=3), [], b""),
        "offset-2p63.gguf": gguf([], [("w", [4, 1], 0, 1 << 63)], b"\x11" * 64),
        "elements-2p59.gguf": gguf([], [("w", [1 << 30, 1 << 29], 0, 0)], b"\x11" * 64),
        "empty.gguf": b"",
        "three-bytes.gguf": b"GGU",
    },
    "safetensors_fuzz": {
        "nan-f32.safetensors": safetensors("w", "F32", [2, 2], struct.pack("<4f", 1, 2, float("nan"), 4)),
        "inf-bf16.safetensors": safetensors("w", "BF16", [4], struct.pack("<4H", 0x3F80, 0x7F80, 0x3F80, 0x3F80)),
        "empty.safetensors": b"",
        "three-bytes.safetensors": b"\x10\x00\x00",
    },
    "config_fuzz": {
        "empty.json": b"",
        "three-bytes.json": b'{"a',
        "huge-rope-theta.json": json.dumps({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
                                            "intermediate_size": 8, "num_hidden_layers": 1,
                                            "num_attention_heads": 2}).encode()[:-1] + b', "rope_theta": 1e999}',
    },
}
for target, files in seeds.items():
    for name, data in files.items():
        write(target, name, data)
