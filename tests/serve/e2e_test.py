#!/usr/bin/env python3
"""`dtensor serve` end to end (ctest label `serve`): the real program under dtrun at --tp ranks on
the tiny GGUF fixture, asked by real clients, the `openai` package and curl.

    tools/reference/.venv/bin/python tests/serve/e2e_test.py --dtensor build/bin/dtensor \\
        --dtrun build/bin/dtrun --generate build/bin/generate \\
        --model tests/fixtures/gguf/llama-tiny.gguf --tp 2

Checks, in order:
  - GET /v1/models, /health; completions and chat through openai, whole and streamed (the stream's
    pieces add up to the whole answer, usage counted);
  - curl's answers, whole and streamed, equal openai's;
  - 12 requests at once (greedy and seeded sampling, several prompt lengths) give the answers they
    give one at a time, and the tokens `generate` gives for the same prompt ids and options;
  - bad requests raise openai's BadRequestError naming the field, and the server goes on;
  - /metrics back to idle: no open request, no KV page in use;
  - SIGTERM to dtrun: a stream in flight finishes with [DONE], new requests are refused, every
    rank exits 0 (dtrun itself exits 128 + SIGTERM);
  - at tp >= 2, a rank killed: requests get 503 and dtrun exits non-zero within the collective
    timeout (COLLECTIVE_TIMEOUT_S, set as DT_TIMEOUT_MS) and EXIT_S more.
Exits 77 (skipped) without the openai package or curl.
"""
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import (Served, check, check_drain, check_idle, decode, generate_ids,  # noqa: E402
                           openai_or_skip, serve_args, shown_ids, skip, sse_payloads, stream_text)


def curl(url, body, stream=False):
    out = subprocess.run(["curl", "-sS", "--fail-with-body", "--max-time", "120", *(["-N"] if stream else []),
                          "-H", "Content-Type: application/json", "-d", json.dumps(body), url],
                         capture_output=True, text=True)
    check(out.returncode == 0, f"curl {url}: {out.returncode} {out.stderr} {out.stdout}")
    return out.stdout


def openai_answers(client, name):
    """Completions and chat, whole and streamed; returns the whole answers' texts."""
    c = client.completions.create(model=name, prompt="Once upon a time", max_tokens=12, temperature=0)
    check(c.object == "text_completion" and len(c.choices) == 1, c)
    check(c.usage.completion_tokens >= 1 and c.usage.prompt_tokens >= 1, c.usage)
    check(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens, c.usage)
    check(c.choices[0].finish_reason in ("stop", "length"), c)
    pieces, finish = [], None
    for chunk in client.completions.create(model=name, prompt="Once upon a time", max_tokens=12, temperature=0,
                                           stream=True):
        pieces.append(chunk.choices[0].text)
        finish = chunk.choices[0].finish_reason or finish
    check("".join(pieces) == c.choices[0].text, f"streamed {pieces!r} != {c.choices[0].text!r}")
    check(finish == c.choices[0].finish_reason, (finish, c.choices[0].finish_reason))

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model=name, messages=messages, max_tokens=10, temperature=0.8, seed=7)
    check(r.object == "chat.completion" and r.choices[0].message.role == "assistant", r)
    text, usage = "", None
    for chunk in client.chat.completions.create(model=name, messages=messages, max_tokens=10, temperature=0.8,
                                                seed=7, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
    check(text == r.choices[0].message.content, f"streamed {text!r} != {r.choices[0].message.content!r}")
    check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, (usage, r.usage))
    return c.choices[0].text, r.choices[0].message.content


def check_curl(s, name, completion_text, chat_text):
    j = json.loads(curl(s.url + "/v1/completions",
                        {"model": name, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}))
    check(j["choices"][0]["text"] == completion_text, (j, completion_text))
    text, _ = stream_text(sse_payloads(curl(s.url + "/v1/completions",
                                            {"model": name, "prompt": "Once upon a time", "max_tokens": 12,
                                             "temperature": 0, "stream": True}, stream=True)))
    check(text == completion_text, (text, completion_text))
    body = {"model": name, "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 10, "temperature": 0.8, "seed": 7, "stream": True}
    text, _ = stream_text(sse_payloads(curl(s.url + "/v1/chat/completions", body, stream=True)))
    check(text == chat_text, (text, chat_text))


def requests_to_compare():
    """Prompt ids of several lengths, greedy and sampled."""
    out = []
    for i in range(12):
        ids = [1 + (7 * i + 3 * k) % 300 for k in range(3 + 9 * i)]
        sampling = {"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": i}
        out.append({"prompt": ids, "max_tokens": 8 + 3 * i, **sampling})
    return out


def check_concurrency(s, name):
    """The same answers at once as one at a time; returns them."""
    bodies = [dict(b, model=name) for b in requests_to_compare()]

    def ask(body):
        status, text = s.post("/v1/completions", body)
        check(status == 200, text)
        j = json.loads(text)
        return j["choices"][0]["text"], j["choices"][0]["finish_reason"], j["usage"]["completion_tokens"]

    alone = [ask(b) for b in bodies]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(ask, bodies))
    for b, a, t in zip(bodies, alone, together):
        check(a == t, f"prompt of {len(b['prompt'])} tokens: alone {a!r}, together {t!r}")
    return bodies, alone


def check_against_generate(args, bodies, answers):
    """The server's tokens are generate's for the same prompt ids and options (one rank)."""
    for body, (text, finish, tokens) in zip(bodies, answers):
        flags = ["--prompt-ids", ",".join(map(str, body["prompt"])), "--max-new-tokens", str(body["max_tokens"])]
        if body["temperature"] > 0:
            flags += ["--temperature", str(body["temperature"]), "--top-k", str(body["top_k"]),
                      "--top-p", str(body["top_p"]), "--seed", str(body["seed"])]
        _, ids = generate_ids(args.generate, args.model, flags)
        check(decode(args.dtensor, args.model, shown_ids(ids, finish, tokens)) == text,
              f"{body}: generate {ids}, the server {text!r} ({finish}, {tokens})")


def check_errors(client, name):
    import openai
    cases = [({"model": "no-such-model", "prompt": "x"}, "model"),
             ({"model": name, "prompt": "x", "max_tokens": -1}, "max_tokens"),
             ({"model": name, "prompt": "x", "n": 2}, "n"),
             ({"model": name, "prompt": "x " * 5000}, "prompt")]
    for body, param in cases:
        try:
            client.completions.create(**body)
        except openai.BadRequestError as e:
            check(e.status_code == 400 and e.body.get("param") == param, (body, e.body))
        else:
            raise AssertionError(f"{body} was answered")


# The rank-death check's collective timeout (DT_TIMEOUT_MS): a dead rank fails rank 0's step within
# it (the shm backend sees a dead process at once; the timeout bounds any backend). Then rank 0
# answers its open requests with 503 and exits, and dtrun after it, within EXIT_S more: no
# collective is left to wait for, so EXIT_S is only scheduling and process exit (0.03-0.2 s from
# the kill to dtrun's exit measured on the AMD EPYC Zen 4 VM, 2 vCPUs, at load average 11, with
# a timeout of 3 s or of 60 s alike); its margin is for a machine far busier.
COLLECTIVE_TIMEOUT_S = 3
EXIT_S = 10


def check_rank_death(args):
    with Served(args.dtensor, args.dtrun, args.model, tp=args.tp,
                env={"DT_TIMEOUT_MS": str(COLLECTIVE_TIMEOUT_S * 1000)}) as s:
        name = os.path.basename(args.model)[:-len(".gguf")]
        status, _ = s.post("/v1/completions", {"model": name, "prompt": "Hi", "max_tokens": 4})
        check(status == 200, status)
        os.kill(s.rank_pid(1), signal.SIGKILL)
        start = time.time()
        deadline = start + COLLECTIVE_TIMEOUT_S + EXIT_S
        try:
            status, body = s.post("/v1/completions", {"model": name, "prompt": "Hi", "max_tokens": 4},
                                  timeout_s=deadline - time.time())
            check(status == 503, (status, body))
        except (ConnectionError, OSError):
            pass  # rank 0 may have gone already (a request still unanswered at the deadline fails below)
        code = s.wait(max(0.0, deadline - time.time()))
        check(code not in (None, 0), f"dtrun {code} {time.time() - start:.1f} s after a rank died, the "
              f"collective timeout being {COLLECTIVE_TIMEOUT_S} s:\n{s.output()}")


def main():
    args = serve_args(__doc__)
    openai = openai_or_skip()
    if shutil.which("curl") is None:
        skip("curl is not on PATH")
    name = os.path.basename(args.model)[:-len(".gguf")]
    with Served(args.dtensor, args.dtrun, args.model, tp=args.tp) as s:
        status, body = s.get("/v1/models")
        check(status == 200 and json.loads(body)["data"][0]["id"] == name, body)
        check(s.get("/health") == (200, '{"status":"ok"}'), s.get("/health"))
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        completion_text, chat_text = openai_answers(client, name)
        check_curl(s, name, completion_text, chat_text)
        bodies, answers = check_concurrency(s, name)
        check_against_generate(args, bodies, answers)
        check_errors(client, name)
        check_idle(s)
        check_drain(s, name)
    if args.tp >= 2:
        check_rank_death(args)
    print(f"OK: dtensor serve at tp {args.tp}: openai and curl, whole and streamed, concurrent = alone = "
          f"generate, errors, idle, drain" + (", a dead rank" if args.tp >= 2 else ""))


if __name__ == "__main__":
    main()
