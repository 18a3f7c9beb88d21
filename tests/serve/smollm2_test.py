#!/usr/bin/env python3
"""`dtensor serve` on the real model (ctest labels `model;serve`): SmolLM2-135M-Instruct's Q4_1 GGUF
(scripts/fetch-smollm2) under dtrun at --tp ranks on shm, asked by the `openai` package. Issue 48's
"done": the real model served at tp 1 and tp 3 to the openai client, with streaming.

    tools/reference/.venv/bin/python tests/serve/smollm2_test.py --dtensor build/bin/dtensor \\
        --dtrun build/bin/dtrun --generate build/bin/generate \\
        --model build/models/SmolLM2-135M-Instruct.Q4_1.gguf --tp 3

Checks, in order, all greedy:
  - chat "What is the capital of France?", whole and streamed: the same answer, naming Paris, and
    generate's tokens for that chat (--chat, the same tp under dtrun);
  - a completion of a fixed English prompt: generate's tokens for that prompt (its prompt ids as
    many as the answer's prompt_tokens, its text the answer's);
  - 6 English prompts at once give the answers they give one at a time (English, not random ids:
    Note [Batching and rounding] in nn/models/engine.cc, near-ties may go either way);
  - /metrics back to idle; SIGTERM drains a stream in flight and every rank exits 0.
Exits 77 (skipped) without the cached GGUF or the openai package.
"""
import concurrent.futures
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import (Served, check, check_drain, check_idle, decode, generate_ids,  # noqa: E402
                           openai_or_skip, serve_args, shown_ids, skip)

QUESTION = "What is the capital of France?"
COMPLETION_PROMPT = "The history of the Roman Empire"
PROMPTS = ["Once upon a time, in a small village,", "The best way to learn a new language is",
           "Photosynthesis is the process by which", "My favourite season of the year is",
           "To bake a loaf of bread, you first", "The largest ocean on Earth is"]
MAX_TOKENS = 20


def check_generate(args, flags, text, finish, prompt_tokens, completion_tokens, what):
    """An answer is generate's tokens at the same tp: the same prompt length, the same new text."""
    prompt_ids, ids = generate_ids(args.generate, args.model, [*flags, "--max-new-tokens", str(MAX_TOKENS)],
                                   dtrun=args.dtrun, tp=args.tp)
    check(len(prompt_ids) == prompt_tokens, f"{what}: generate's prompt {prompt_ids}, the server's {prompt_tokens} tokens")
    expected = decode(args.dtensor, args.model, shown_ids(ids, finish, completion_tokens))
    check(expected == text, f"{what}: generate {ids} = {expected!r}, the server {text!r} ({finish}, {completion_tokens})")


def check_chat(args, client, name):
    messages = [{"role": "user", "content": QUESTION}]
    r = client.chat.completions.create(model=name, messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    answer = r.choices[0].message.content
    text, finish, usage = "", None, None
    for chunk in client.chat.completions.create(model=name, messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    check(text == answer, f"streamed {text!r} != {answer!r}")
    check(finish == r.choices[0].finish_reason, (finish, r.choices[0].finish_reason))
    check(usage is not None and (usage.prompt_tokens, usage.completion_tokens) ==
          (r.usage.prompt_tokens, r.usage.completion_tokens), (usage, r.usage))
    check("Paris" in answer, f"{QUESTION} {answer!r}")
    check_generate(args, ["--prompt", QUESTION, "--chat"], answer, r.choices[0].finish_reason,
                   r.usage.prompt_tokens, r.usage.completion_tokens, "chat")
    return answer


def check_completion(args, client, name):
    c = client.completions.create(model=name, prompt=COMPLETION_PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    check(len(c.choices[0].text) > 0, c)
    check_generate(args, ["--prompt", COMPLETION_PROMPT], c.choices[0].text, c.choices[0].finish_reason,
                   c.usage.prompt_tokens, c.usage.completion_tokens, "completion")


def check_concurrency(client, name):
    def ask(prompt):
        c = client.completions.create(model=name, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        return c.choices[0].text, c.choices[0].finish_reason, c.usage.completion_tokens

    alone = [ask(p) for p in PROMPTS]
    check(len(set(a[0] for a in alone)) == len(PROMPTS), f"answers not distinct: {alone}")
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(ask, PROMPTS))
    for p, a, t in zip(PROMPTS, alone, together):
        check(a == t, f"{p!r}: alone {a!r}, together {t!r}")


def main():
    args = serve_args(__doc__)
    if not os.path.isfile(args.model):
        skip(f"{args.model} is not cached (scripts/fetch-smollm2)")
    openai = openai_or_skip()
    name = os.path.basename(args.model)[:-len(".gguf")]
    with Served(args.dtensor, args.dtrun, args.model, tp=args.tp) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        answer = check_chat(args, client, name)
        check_completion(args, client, name)
        check_concurrency(client, name)
        check_idle(s)
        check_drain(s, name, max_tokens=64)
    print(f"OK: {name} served at tp {args.tp}: chat {answer!r} whole = streamed = generate's, a completion = "
          f"generate's, {len(PROMPTS)} prompts at once = one at a time, idle, drain")


if __name__ == "__main__":
    main()
