#!/usr/bin/env python3
"""Golden fixtures for the GGUF reader, the BPE tokenizer and Llama-from-GGUF, made with the real
gguf (gguf-py), tokenizers and transformers packages.

    tools/reference/.venv/bin/python tools/reference/make_gguf_fixtures.py [--out tests/fixtures]
        [--smollm2 PATH.gguf [--types-dir DIR]] [--only quants|smollm2-types]

Writes tests/fixtures/gguf/:
  quants.gguf              one [4, 512] tensor per type F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K
                           Q5_K Q6_K Q2_K Q3_K IQ4_NL IQ4_XS (random blocks with finite scales), a
                           3-D F32 tensor, and metadata of every GGUF value type (scalars, strings,
                           nested arrays)
  quants_expected.safetensors  the same tensors dequantized to f32 by gguf.quants.dequantize
  metadata.json            the metadata as gguf.GGUFReader reads it (for the reader's test)
  tokenizer.json           a byte-level BPE trained with `tokenizers` (SmolLM2's pre-tokenizer:
                           individual digits, then GPT-2's ByteLevel split) with ChatML specials
  llama3-tokenizer/        the same corpus through a tokenizer in Llama 3's layout (Split regex,
                           ignore_merges, BOS template) with Llama 3's chat template: golden.json
  tokenizer_golden.json    ids of a corpus of hard strings through that tokenizer (HF tokenizers),
                           its decodes, and the same through transformers' GGUF tokenizer
  llama-tiny.gguf          a random tiny Llama (hidden 256, 2 layers, 8 / 4 heads) in llama.cpp's
                           layout (Q/K rows permuted as convert_hf_to_gguf does), one quant type per
                           weight (all eleven), untied Q6_K output, the tokenizer in its metadata
  llama_gguf_golden.json   transformers' logits (every prompt position) and greedy continuation
                           after loading llama-tiny.gguf (from_pretrained(gguf_file=...), f32)
--only quants writes quants.gguf, quants_expected.safetensors and metadata.json alone.
With --smollm2 (the SmolLM2-135M-Instruct.Q4_1.gguf that scripts/fetch-smollm2 unpacks) also
  smollm2_golden.json      transformers' greedy continuations of raw prompts (40 tokens), the
                           corpus' ids (SmolLM2's own pre-tokenizer; see make_smollm2), and the chat template applied to a
                           conversation (with and without a system message)
  smollm2_logits.safetensors  the prompts' last-position logits (last_logits.0, .1; f32)
  smollm2_types_golden.json  SmolLM2 re-quantized by llama.cpp into Q2_K, Q3_K, IQ4_NL and IQ4_XS
                           (SMOLLM2_TYPES; the files go to --types-dir, never committed): each
                           file's sha256 and tensor types, transformers' greedy continuations of
                           the raw prompts and their 32 largest last-position logits
    (--only smollm2-types: that alone; --quantize-smollm2 SRC --types-dir DIR: the test's step,
    the files alone, checked against the goldens' sha256)
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import save_file

CORPUS = [
    "Hello world",
    "Hello, world! How are you today?",
    "  leading spaces and trailing   ",
    "line one\nline two\n\n\tindented\r\nwindows",
    "numbers 1234567 and 3.14159 and 1,000,000",
    "contractions: I'm, you're, it's, we'll, they've, she'd, don't, CAN'T",
    "unicode: café naïve résumé Ærøskøbing ß",
    "中文字符和日本語のテキスト、한국어",
    "emoji 😀🎉👍🏽 and flags 🇫🇷",
    "math ∑ x² ≤ ∞ → λ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "special in text<|endoftext|>after",
    "code: def f(x):\n    return x**2  # square",
    "mixed\u00a0non-breaking\u2003em-space",
    "",
    " ",
    "a",
    "!!!???...",
    "The quick brown fox jumps over the lazy dog. " * 3,
]

def generated_corpus(n=200, seed=0):
    """Deterministic random mixes of hard fragments: every script, whitespace kind, digit run,
    contraction case, emoji sequence, code and special-token text, and very long words."""
    import random
    rng = random.Random(seed)
    frags = ["hello", "World", "don't", "I'M", "we'LL", "they'Ve", "it's", "'s", "'", "''",
             "café", "naïve", "Ærøskøbing", "straße", "İstanbul", "ǅemal", "Ωμέγα", "Привет",
             "мир", "中文", "日本語の", "テキスト", "한국어", "ไทย", "हिन्दी", "عربي", "עברית",
             "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "∑", "x²", "≤", "→", "½", "٣", "१२३",
             "0", "7", "42", "1234567", "3.14159", "1,000", "-12", "+3e10", "0x1F",
             "def", "f(x):", "return", "x**2", "#", "//", "{", "}", "[]", "()", "=>", "!=",
             "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "|>", "<", ">",
             "...", "!!!", "???", "—", "–", "«", "»", "“quoted”", "(paren)", "@user",
             "https://example.com/a?b=c", "e-mail@example.org", "$100", "€5", "%", "&amp;"]
    seps = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u2003",
            "\u3000", "", "", "", ", ", ". ", "\t\t", " \t", "\n    "]
    out = []
    for k in range(n):
        parts = [rng.choice(frags) for _ in range(rng.randint(1, 9))]
        text = ""
        for p in parts:
            text += p + rng.choice(seps)
        if k % 23 == 0:
            text = rng.choice(frags) * rng.randint(20, 120)  # very long words
        if k % 17 == 0:
            text = rng.choice(seps) + text + rng.choice(seps)
        out.append(text)
    return out


CORPUS += generated_corpus()

TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello tokenizers, hello byte pair encoding.",
    "Numbers like 12345 and 3.14 are split digit by digit.",
    "I'm sure you're right; it's what we'll do, they've said.",
    "café naïve résumé — unicode text with accents.",
    "def square(x):\n    return x * x\n",
] * 20

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")

QUANT_TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K,
               Q.Q6_K]
# Written after t.cube, so that the tensors above keep the bytes they had before these were read.
LATER_QUANT_TYPES = [Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS]
# Byte offsets of the f16 scale fields inside one block of each quantized type.
F16_FIELDS = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2],
              Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208], Q.Q2_K: [80, 82], Q.Q3_K: [108],
              Q.IQ4_NL: [0], Q.IQ4_XS: [0]}


def random_quant(rng, qtype, rows, cols, scale):
    """Raw bytes [rows, bytes per row] of random blocks whose f16 scales are finite."""
    if qtype == Q.F32:
        return (rng.standard_normal((rows, cols)) * scale * 20).astype(np.float32)
    if qtype == Q.F16:
        return (rng.standard_normal((rows, cols)) * scale * 20).astype(np.float16)
    if qtype == Q.BF16:
        x = (rng.standard_normal((rows, cols)) * scale * 20).astype(np.float32)
        return gguf.quants.quantize(x, Q.BF16)
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    nblocks = rows * cols // block
    raw = rng.integers(0, 256, size=(nblocks, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        d = (rng.uniform(0.2, 1.0, size=nblocks) * scale).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(rows, cols // block * nbytes)


def add(writer, name, qtype, data):
    if qtype in (Q.F32, Q.F16):
        writer.add_tensor(name, data)
    else:
        writer.add_tensor(name, data, raw_dtype=qtype)


def dequant(qtype, data):
    if qtype in (Q.F32, Q.F16):
        return data.astype(np.float32)
    return gguf.quants.dequantize(data, qtype).astype(np.float32)


def make_quants(out):
    rng = np.random.default_rng(7)
    path = os.path.join(out, "quants.gguf")
    w = gguf.GGUFWriter(path, arch="test")
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.15625)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo wörld")
    w.add_uint64("test.u64", 18000000000000000000)
    w.add_int64("test.i64", -9000000000000000000)
    w.add_float64("test.f64", 2.718281828459045)
    w.add_array("test.array_i32", [1, -2, 3])
    w.add_array("test.array_str", ["a", "bc", ""])
    w.add_array("test.array_nested", [[1, 2], [3]])
    w.add_array("test.array_empty", [])
    expected = {}
    for qtype in QUANT_TYPES:
        data = random_quant(rng, qtype, 4, 512, 0.05)
        name = f"t.{qtype.name}"
        add(w, name, qtype, data)
        expected[name] = dequant(qtype, data).reshape(4, 512)
    cube = rng.standard_normal((2, 3, 5)).astype(np.float32)
    w.add_tensor("t.cube", cube)
    expected["t.cube"] = cube
    for qtype in LATER_QUANT_TYPES:
        data = random_quant(rng, qtype, 4, 512, 0.05)
        name = f"t.{qtype.name}"
        add(w, name, qtype, data)
        expected[name] = dequant(qtype, data).reshape(4, 512)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_file(expected, os.path.join(out, "quants_expected.safetensors"))
    # What gguf's own reader makes of the metadata.
    r = gguf.GGUFReader(path)
    meta = {}
    for f in r.fields.values():
        if not f.name.startswith("test."):
            continue
        meta[f.name] = f.contents()
    with open(os.path.join(out, "metadata.json"), "w") as fh:
        json.dump(meta, fh, indent=1, ensure_ascii=False)
    print("wrote", path)


def make_tokenizer(out):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, processors
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TRAIN_TEXT, trainer)
    path = os.path.join(out, "tokenizer.json")
    tok.save(path)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as fh:
        json.dump({"bos_token": None, "eos_token": "<|im_end|>", "chat_template": CHAT_TEMPLATE,
                   "add_bos_token": False}, fh, indent=1)
    golden = {"corpus": CORPUS, "ids": [], "decoded": []}
    for text in CORPUS:
        ids = tok.encode(text).ids
        golden["ids"].append(ids)
        golden["decoded"].append(tok.decode(ids, skip_special_tokens=False))
    print("wrote", path, "vocab", tok.get_vocab_size())
    return tok, golden


# The llama.cpp source whose convert_hf_to_gguf.py writes gemma-tokenizer/vocab.gguf
# (make_zoo_fixtures.py's LLAMA_CPP).
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]


def make_gemma_tokenizer(out):
    """Gemma's tokenizer in both spellings, from one SentencePiece BPE model trained as Gemma's is
    (byte fallback, digits split, no dummy prefix, whitespace kept; pad 0, eos 1, bos 2, unk 3,
    <start_of_turn> / <end_of_turn> after them): gemma-tokenizer/tokenizer.json as transformers'
    GemmaConverter lays it out (BPE with byte_fallback and fuse_unk, merges from the pieces'
    scores, normalizer Replace(" ", "▁"), decoders Replace / ByteFallback / Fuse, BOS by the
    post-processor; built with `tokenizers` here since the converter needs protobuf), and
    gemma-tokenizer/vocab.gguf, llama.cpp's convert_hf_to_gguf.py --vocab-only of the model
    (tokenizer.ggml.model "llama": tokens, scores, types). gemma_tokenizer_golden.json: the corpus'
    ids through `tokenizers` on the tokenizer.json — equal to sentencepiece's own on the model,
    which the script asserts — and its decodes."""
    import shutil
    import subprocess
    import tempfile
    import sentencepiece as spm
    from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            processors)
    from transformers import GemmaTokenizer
    from transformers.convert_slow_tokenizer import generate_merges
    from make_zoo_fixtures import LLAMA_CPP as llama_cpp
    if llama_cpp is None:
        raise SystemExit("no llama.cpp source: set LLAMA_CPP (see make_zoo_fixtures.py)")
    d = os.path.join(out, "gemma-tokenizer")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with tempfile.TemporaryDirectory() as tmp:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(list(dict.fromkeys(TRAIN_TEXT)) * 5),
            model_prefix=os.path.join(tmp, "tokenizer"), model_type="bpe", vocab_size=500,
            hard_vocab_limit=False, byte_fallback=True, split_digits=True, add_dummy_prefix=False,
            remove_extra_whitespaces=False, normalization_rule_name="identity",
            allow_whitespace_only_pieces=True, character_coverage=1.0, pad_id=0, eos_id=1,
            bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
            unk_piece="<unk>", user_defined_symbols=GEMMA_SPECIALS[4:], num_threads=1,
            minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=os.path.join(tmp, "tokenizer.model"))
        n = sp.get_piece_size()
        vocab = {sp.id_to_piece(i): i for i in range(n)}
        merges = generate_merges(vocab, {sp.id_to_piece(i): sp.get_score(i) for i in range(n)})
        tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True,
                                   byte_fallback=True))
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t in GEMMA_SPECIALS])
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)])
        GemmaTokenizer(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                       pad_token="<pad>", unk_token="<unk>", mask_token=None).save_pretrained(d)
        # The converter's input: the model, a tokenizer_config whose added_tokens_decoder marks
        # the special tokens (Gemma's publishes one; they become CONTROL tokens) and a Gemma
        # config.json (vocab-only still writes the architecture's keys).
        with open(os.path.join(d, "tokenizer_config.json")) as fh:
            tc = json.load(fh)
        tc["added_tokens_decoder"] = {str(vocab[t]): {"content": t, "special": True}
                                      for t in GEMMA_SPECIALS}
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as fh:
            json.dump(tc, fh)
        config = {"architectures": ["GemmaForCausalLM"], "model_type": "gemma",
                  "vocab_size": n, "hidden_size": 64, "intermediate_size": 128,
                  "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 1,
                  "head_dim": 16, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
                  "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
        with open(os.path.join(tmp, "config.json"), "w") as fh:
            json.dump(config, fh)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([llama_cpp,
                                                           os.path.join(llama_cpp, "gguf-py")]))
        subprocess.run([sys.executable, os.path.join(llama_cpp, "convert_hf_to_gguf.py"), tmp,
                        "--vocab-only", "--outfile", os.path.join(d, "vocab.gguf"),
                        "--model-name", "gemma-vocab"],
                       check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        back = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        golden = {"corpus": CORPUS, "ids": [], "decoded": []}
        for text in CORPUS:
            ids = back.encode(text, add_special_tokens=False).ids
            assert ids == sp.encode(text), f"tokenizers and sentencepiece differ on {text!r}"
            golden["ids"].append(ids)
            golden["decoded"].append(back.decode(ids, skip_special_tokens=False))
        golden["with_bos"] = back.encode("Hello world").ids
    with open(os.path.join(out, "gemma_tokenizer_golden.json"), "w") as fh:
        json.dump(golden, fh, ensure_ascii=False)
    print("wrote", d, "vocab", n, "merges", len(merges))


LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"]
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def make_llama3_tokenizer(out):
    """Llama 3's tokenizer.json layout: a Split regex then ByteLevel without its own regex,
    ignore_merges, a TemplateProcessing post-processor adding <|begin_of_text|>, and Llama 3's
    chat template; ids and chat texts through transformers."""
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, trainers, processors
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=450, special_tokens=LLAMA3_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TRAIN_TEXT, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    d = os.path.join(out, "llama3-tokenizer")
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as fh:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                   "chat_template": LLAMA3_TEMPLATE}, fh, indent=1)
    ht = PreTrainedTokenizerFast.from_pretrained(d)
    messages = [{"role": "system", "content": "  Be brief. "},
                {"role": "user", "content": "What is 2+2?\n"}]
    golden = {"corpus": CORPUS,
              "ids": [tok.encode(t, add_special_tokens=False).ids for t in CORPUS],
              "ids_with_bos": [ht.encode(t) for t in CORPUS[:5]],
              "chat": {"messages": messages,
                       "text": ht.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True)}}
    golden["decoded"] = [tok.decode(i, skip_special_tokens=False) for i in golden["ids"]]
    with open(os.path.join(d, "golden.json"), "w") as fh:
        json.dump(golden, fh, indent=1, ensure_ascii=False)
    print("wrote", d)


def permute(w, n_head):
    """convert_hf_to_gguf's LlamaModel.permute: Q/K rows from HF's half-split to pairs."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def add_tokenizer_metadata(w, tok):
    vocab = tok.get_vocab()
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    model = json.loads(tok.to_str())["model"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_unk_token_id(vocab["<|endoftext|>"])
    w.add_pad_token_id(vocab["<|im_end|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def make_tiny_llama(out, tok, golden):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    rng = np.random.default_rng(11)
    H, L, NH, NKV, HD, I = 256, 2, 8, 4, 32, 512
    V = tok.get_vocab_size()
    path = os.path.join(out, "llama-tiny.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name("llama-tiny")
    w.add_context_length(512)
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(I)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_dimension_count(HD)
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(V)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    add_tokenizer_metadata(w, tok)
    types = {
        0: dict(attn_q=Q.Q4_0, attn_k=Q.Q4_1, attn_v=Q.Q5_0, attn_output=Q.Q5_1, ffn_gate=Q.Q8_0,
                ffn_up=Q.F16, ffn_down=Q.BF16),
        1: dict(attn_q=Q.Q4_K, attn_k=Q.Q5_K, attn_v=Q.Q6_K, attn_output=Q.Q4_K,
                ffn_gate=Q.Q5_K, ffn_up=Q.Q6_K, ffn_down=Q.Q5_0),
    }
    shapes = dict(attn_q=(NH * HD, H), attn_k=(NKV * HD, H), attn_v=(NKV * HD, H),
                  attn_output=(H, NH * HD), ffn_gate=(I, H), ffn_up=(I, H), ffn_down=(H, I))

    def weight(name, qtype, rows, cols, heads=None):
        data = random_quant(rng, qtype, rows, cols, 0.004)
        if heads is not None:
            # The checkpoint holds the permuted rows of an HF weight: permute whole rows (the
            # row bytes of a quantized tensor are its row's blocks).
            data = np.ascontiguousarray(permute(data, heads))
        add(w, name, qtype, data)

    weight("token_embd.weight", Q.Q8_0, V, H)
    for layer in range(L):
        for k, qtype in types[layer].items():
            rows, cols = shapes[k]
            heads = NH if k == "attn_q" else NKV if k == "attn_k" else None
            weight(f"blk.{layer}.{k}.weight", qtype, rows, cols, heads)
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{layer}.{norm}.weight",
                         rng.uniform(0.5, 1.5, H).astype(np.float32))
    w.add_tensor("output_norm.weight", rng.uniform(0.5, 1.5, H).astype(np.float32))
    weight("output.weight", Q.Q6_K, V, H)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", path)

    model = AutoModelForCausalLM.from_pretrained(out, gguf_file="llama-tiny.gguf",
                                                 dtype=torch.float32)
    model.eval()
    gtok = AutoTokenizer.from_pretrained(out, gguf_file="llama-tiny.gguf")
    golden["gguf_ids"] = [gtok.encode(t, add_special_tokens=False) for t in CORPUS]
    with open(os.path.join(out, "tokenizer_golden.json"), "w") as fh:
        json.dump(golden, fh, indent=1, ensure_ascii=False)
    prompt = golden["ids"][1]
    ids = torch.tensor([prompt])
    with torch.no_grad():
        logits = model(ids).logits[0]
    out_golden = {"prompt": prompt, "logits": logits.tolist(), "greedy": greedy(model, prompt, 24)}
    with open(os.path.join(out, "llama_gguf_golden.json"), "w") as fh:
        json.dump(out_golden, fh)
    print("wrote llama_gguf_golden.json; greedy", out_golden["greedy"])


def greedy(model, ids, n):
    """Plain argmax decoding for n steps: no EOS stop and no logits processors (generate's
    min_new_tokens would mask EOS, which dtensor's greedy run does not)."""
    import torch
    ids = list(ids)
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
            out.append(nxt)
    return out


def make_smollm2(out, path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    prompts = ["The capital of France is", "def fibonacci(n):\n    \"\"\"Return the n-th"]
    logits = {}
    # transformers' GGUF loader gives every gpt2-model vocabulary GPT-2's ByteLevel split and
    # drops tokenizer.ggml.pre ("smollm": digits one by one, as SmolLM2's own tokenizer.json and
    # llama.cpp split them). corpus_ids: that tokenizer with SmolLM2's real pre-tokenizer
    # (Digits(individual) then ByteLevel) restored, through `tokenizers`; the ids of
    # transformers' GGUF tokenizer are kept beside them (they differ on non-ASCII digits).
    from tokenizers import Tokenizer as HfTokenizer, pre_tokenizers
    hub = HfTokenizer.from_str(tok.backend_tokenizer.to_str())
    hub.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    golden = {"prompts": [], "corpus": CORPUS,
              "corpus_ids": [hub.encode(t, add_special_tokens=False).ids for t in CORPUS],
              "transformers_gguf_ids": [tok.encode(t, add_special_tokens=False) for t in CORPUS]}
    golden["pre_tokenizer_differs"] = [i for i in range(len(CORPUS))
                                       if golden["corpus_ids"][i] != golden["transformers_gguf_ids"][i]]
    for p in prompts:
        ids = tok.encode(p, add_special_tokens=False)
        t = torch.tensor([ids])
        with torch.no_grad():
            last = model(t).logits[0, -1]
        logits[f"last_logits.{len(logits)}"] = last.numpy().astype(np.float32)
        gen = greedy(model, ids, 40)
        golden["prompts"].append({"text": p, "ids": ids, "greedy": gen,
                                  "greedy_text": tok.decode(gen)})
        print(repr(p), "->", repr(golden["prompts"][-1]["greedy_text"]))
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    golden["chat"] = {"messages": messages,
                      "text": tok.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True)}
    with_system = [{"role": "system", "content": "Answer briefly."}] + messages
    golden["chat_system"] = {"messages": with_system,
                             "text": tok.apply_chat_template(with_system, tokenize=False,
                                                             add_generation_prompt=True)}
    golden["bos_token_id"] = tok.bos_token_id
    golden["eos_token_id"] = tok.eos_token_id
    save_file(logits, os.path.join(out, "smollm2_logits.safetensors"))
    with open(os.path.join(out, "smollm2_golden.json"), "w") as fh:
        json.dump(golden, fh, ensure_ascii=False)
    print("wrote smollm2_golden.json")


# SmolLM2 re-quantized by llama.cpp's own quantizer (llama_model_quantize through
# llama-cpp-python) into each type issue 47 added, for the model-level check
# (tests/models/gguf_types_test.cc). (type, llama.cpp file type, pure): SmolLM2's hidden size 576
# is not whole 256-element super-blocks, so llama.cpp gives a k-quant only to ffn_down (rows of
# 1536) and falls back to Q4_0 elsewhere; its Q2_K mix gives ffn_down Q3_K and its Q3_K_M mix none
# at all, so the k-quant files are "pure" (the type wherever it fits). The IQ4 files are llama.cpp's
# own mixes: IQ4_NL nearly everywhere (3 ffn_down Q5_K); IQ4_XS ffn_down, IQ4_NL the rest.
# The source is the Q4_1 file itself (allow_requantize): llama.cpp dequantizes each tensor to f32
# with ggml's reference before quantizing, so an f32 export of the same weights gives the same
# bytes (checked: identical sha256 for Q2_K and IQ4_XS) for 540 MB more on disk.
SMOLLM2_TYPES = [("Q2_K", "MOSTLY_Q2_K", True), ("Q3_K", "MOSTLY_Q3_K_M", True),
                 ("IQ4_NL", "MOSTLY_IQ4_NL", False), ("IQ4_XS", "MOSTLY_IQ4_XS", False)]
SMOLLM2_PROMPTS = ["The capital of France is", "def fibonacci(n):\n    \"\"\"Return the n-th"]
TYPES_GOLDEN = "smollm2_types_golden.json"


def smollm2_type_file(qtype):
    return f"SmolLM2-135M-Instruct.{qtype}.gguf"


def sha256(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def quantize_smollm2(src, types_dir, want=None):
    """Each SMOLLM2_TYPES file from `src` into types_dir (kept when it already has the wanted
    sha256); with `want` (the golden's files), a file of other bytes is an error: the goldens
    belong to the bytes llama-cpp-python 0.3.36 makes."""
    import ctypes
    import llama_cpp
    os.makedirs(types_dir, exist_ok=True)
    for qtype, ftype, pure in SMOLLM2_TYPES:
        path = os.path.join(types_dir, smollm2_type_file(qtype))
        expected = want[qtype]["sha256"] if want else None
        if expected and os.path.exists(path) and sha256(path) == expected:
            continue
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_{ftype}")
        p.allow_requantize = True
        p.pure = pure
        p.nthread = 2
        tmp = path + ".tmp"
        if llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), ctypes.byref(p)) != 0:
            raise SystemExit(f"llama_model_quantize {src} -> {qtype} failed")
        os.replace(tmp, path)
        got = sha256(path)
        if expected and got != expected:
            raise SystemExit(f"{path}: sha256 {got}, but the goldens ({TYPES_GOLDEN}) were made from "
                             f"{expected} (llama-cpp-python {llama_cpp.__version__}; they need 0.3.36)")
        print("wrote", path)


def make_smollm2_types(out, src, types_dir):
    """The SMOLLM2_TYPES files, and transformers' dequantized f32 greedy continuations and top
    last-position logits of SMOLLM2_PROMPTS for each (smollm2_types_golden.json)."""
    import collections
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    quantize_smollm2(src, types_dir)
    golden = {}
    for qtype, ftype, pure in SMOLLM2_TYPES:
        f = smollm2_type_file(qtype)
        path = os.path.join(types_dir, f)
        counts = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors)
        tok = AutoTokenizer.from_pretrained(types_dir, gguf_file=f)
        model = AutoModelForCausalLM.from_pretrained(types_dir, gguf_file=f, dtype=torch.float32)
        model.eval()
        entry = {"file": f, "sha256": sha256(path), "ftype": ftype, "pure": pure,
                 "tensor_types": dict(sorted(counts.items())), "prompts": []}
        for p in SMOLLM2_PROMPTS:
            ids = tok.encode(p, add_special_tokens=False)
            with torch.no_grad():
                last = model(torch.tensor([ids])).logits[0, -1]
            top = torch.topk(last, 32)
            gen = greedy(model, ids, 40)
            entry["prompts"].append({"text": p, "ids": ids, "greedy": gen,
                                     "greedy_text": tok.decode(gen),
                                     "top_ids": top.indices.tolist(),
                                     "top_logits": top.values.tolist()})
            print(qtype, repr(p), "->", repr(entry["prompts"][-1]["greedy_text"]))
        golden[qtype] = entry
    with open(os.path.join(out, TYPES_GOLDEN), "w") as fh:
        json.dump(golden, fh, indent=1, ensure_ascii=False)
    print("wrote", TYPES_GOLDEN)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                                                   "fixtures"))
    ap.add_argument("--smollm2", default=None)
    ap.add_argument("--only", choices=["quants", "smollm2-types", "gemma-tokenizer"],
                    default=None,
                    help="write only quants.gguf (and its expected values), only the "
                         "SmolLM2 type files and smollm2_types_golden.json (needs --smollm2), "
                         "or only Gemma's tokenizer (gemma-tokenizer/, its golden)")
    ap.add_argument("--types-dir", default=None,
                    help="where the SmolLM2 type files go (default: beside --smollm2)")
    ap.add_argument("--quantize-smollm2", default=None, metavar="SRC.gguf",
                    help="test time: only make the SmolLM2 type files from SRC into --types-dir, "
                         "checked against the committed goldens' sha256 (exit 77 without "
                         "llama-cpp-python)")
    a = ap.parse_args()
    out = os.path.join(a.out, "gguf")
    if a.quantize_smollm2:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("llama-cpp-python is not installed: skipped")
            raise SystemExit(77)
        with open(os.path.join(out, TYPES_GOLDEN)) as fh:
            quantize_smollm2(a.quantize_smollm2, a.types_dir, json.load(fh))
        return
    os.makedirs(out, exist_ok=True)
    types_dir = a.types_dir or (os.path.dirname(os.path.abspath(a.smollm2)) if a.smollm2 else None)
    if a.only == "smollm2-types":
        if not a.smollm2:
            ap.error("--only smollm2-types needs --smollm2")
        make_smollm2_types(out, a.smollm2, types_dir)
        return
    if a.only == "gemma-tokenizer":
        make_gemma_tokenizer(out)
        return
    make_quants(out)
    if a.only == "quants":
        return
    tok, golden = make_tokenizer(out)
    make_llama3_tokenizer(out)
    make_gemma_tokenizer(out)
    make_tiny_llama(out, tok, golden)
    if a.smollm2:
        make_smollm2(out, a.smollm2)
        make_smollm2_types(out, a.smollm2, types_dir)


if __name__ == "__main__":
    main()
