#!/usr/bin/env python3
"""A load test of `dtensor serve` (ctest label `soak`): the real program under dtrun on the tiny
GGUF fixture, with the standard library's HTTP client and raw sockets.

    python3 tests/serve/soak_test.py --dtensor build/bin/dtensor --dtrun build/bin/dtrun \\
        --model tests/fixtures/gguf/llama-tiny.gguf [--tp 1] [--minutes 10] [--workers 32]

Phases, then the checks:
  1. 200 connections at once, well-formed (completions and chat, whole and streamed);
  2. a burst of 300 malformed requests (bad JSON, bytes that are not UTF-8, wrong types, unknown
     model, bodies over --max-request-bytes, garbage that is not HTTP);
  3. 100 clients that hang up: mid-stream, and while their whole answer is being made;
  4. --minutes of mixed traffic from --workers threads: all of the above at random.
Every well-formed request must be answered 200 with a complete answer (a stream ends with [DONE]),
every malformed one 4xx; no answer is 5xx; the server never dies. At the end it must come back to
idle (/metrics: no open request, no KV page in use, nothing running or waiting) holding no more file
descriptors than after its first request (/proc/<rank 0>/fd), and SIGTERM must stop every rank
with status 0.
"""
import collections
import concurrent.futures
import http.client
import json
import os
import random
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import Served, check_idle, serve_args, sse_payloads, stream_text  # noqa: E402

MAX_REQUEST_BYTES = 65536


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.failures = []

    def add(self, kind, ok, detail=""):
        with self.lock:
            self.counts[(kind, ok)] += 1
            if not ok and len(self.failures) < 20:
                self.failures.append(f"{kind}: {detail}")


def good_body(rng, name):
    stream = rng.random() < 0.5
    if rng.random() < 0.3:
        path = "/v1/chat/completions"
        body = {"model": name, "messages": [{"role": "user", "content": rng.choice(["Hi", "Tell me a story", "2+2?"])}]}
    else:
        path = "/v1/completions"
        body = {"model": name, "prompt": " ".join(rng.choice(["the", "a", "fox", "runs", "over"])
                                                 for _ in range(rng.randint(1, 60)))}
    body.update(max_tokens=rng.randint(1, 48), stream=stream)
    if rng.random() < 0.5:
        body.update(temperature=0.8, top_k=40, seed=rng.randint(0, 1000))
    else:
        body.update(temperature=0)
    if rng.random() < 0.2:
        body["stop"] = ["the"]
    return path, body


def ask_good(s, rng, name, tally):
    path, body = good_body(rng, name)
    try:
        status, text = s.post(path, body, timeout_s=300)
        if status != 200:
            return tally.add("good", False, f"{status} {text[:200]}")
        if body["stream"]:
            stream_text(sse_payloads(text))
        else:
            json.loads(text)["choices"][0]
        tally.add("good", True)
    except Exception as e:  # an unanswered well-formed request is the failure this test looks for
        tally.add("good", False, repr(e))


def bad_request(rng, name):
    """(raw bytes of a whole HTTP request, the statuses it may get)."""
    kinds = [
        (b'{"model": "%s", "prompt": ' % name.encode(), (400,)),
        (b"\xff\xfe{not json", (400,)),
        (json.dumps({"model": name, "prompt": "a"}).encode()[:-1] + b'\xc3"}', (400,)),
        (json.dumps({"model": name, "prompt": "hi", "max_tokens": -5}).encode(), (400,)),
        (json.dumps({"model": name, "prompt": "hi", "temperature": "hot"}).encode(), (400,)),
        (json.dumps({"model": "nope", "prompt": "hi"}).encode(), (400,)),
        (json.dumps({"model": name, "messages": [{"role": "robot", "content": "x"}]}).encode(), (400,)),
        (json.dumps({"model": name, "prompt": "x" * (MAX_REQUEST_BYTES + 10)}).encode(), (413,)),
        (b"[" * 5000 + b"]" * 5000, (400,)),
    ]
    body, statuses = rng.choice(kinds)
    path = rng.choice(["/v1/completions", "/v1/chat/completions"])
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"Connection: close\r\n\r\n" + body, statuses


def raw_exchange(s, data, timeout_s=60):
    with socket.create_connection((s.host, s.port), timeout=timeout_s) as sock:
        sock.sendall(data)
        out = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return out
            out += chunk


def ask_bad(s, rng, name, tally):
    try:
        if rng.random() < 0.1:  # not HTTP at all: any answer or a close, but no hang
            raw_exchange(s, bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))) + b"\r\n\r\n", 30)
            return tally.add("garbage", True)
        data, statuses = bad_request(rng, name)
        answer = raw_exchange(s, data)
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else -1
        body = answer.split(b"\r\n\r\n", 1)[-1]
        ok = status in statuses and b'"error"' in body
        tally.add("bad", ok, f"{status} {answer[:300]!r} for {data[:120]!r}")
    except Exception as e:
        tally.add("bad", False, repr(e))


def hang_up(s, rng, name, tally):
    path, body = good_body(rng, name)
    body.update(max_tokens=48)
    data = json.dumps(body).encode()
    try:
        sock = socket.create_connection((s.host, s.port), timeout=60)
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        if body["stream"]:
            sock.recv(1024)  # the headers or a first chunk
        else:
            time.sleep(rng.random() * 0.05)
        sock.close()
        tally.add("hang-up", True)
    except Exception as e:
        tally.add("hang-up", False, repr(e))


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def main():
    args = serve_args(__doc__, generate=False, extra=(("--minutes", float, 10), ("--workers", int, 32),
                                                        ("--seed", int, 1)))
    name = os.path.basename(args.model)[:-len(".gguf")]
    rng = random.Random(args.seed)
    tally = Tally()
    flags = ["--max-queue", "256", "--max-request-bytes", str(MAX_REQUEST_BYTES), "--request-timeout", "300"]
    with Served(args.dtensor, args.dtrun, args.model, tp=args.tp, flags=flags) as s:
        pid = s.rank_pid(0)
        ask_good(s, rng, name, tally)
        check_idle(s, timeout_s=60)
        base_fds = fds(pid)
        t0 = time.time()

        def phase(title, n, fn, workers):
            seeds = [rng.randrange(1 << 30) for _ in range(n)]
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                list(pool.map(lambda sd: fn(s, random.Random(sd), name, tally), seeds))
            print(f"{time.time() - t0:7.1f} s  {title}: {dict(tally.counts)}", flush=True)

        phase("200 connections at once", 200, ask_good, 200)
        phase("300 malformed requests", 300, ask_bad, 50)
        phase("100 clients hanging up", 100, hang_up, 50)

        stop_at = time.time() + args.minutes * 60

        def worker(seed):
            r = random.Random(seed)
            while time.time() < stop_at:
                x = r.random()
                (ask_good if x < 0.7 else ask_bad if x < 0.85 else hang_up)(s, r, name, tally)

        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            futures = [pool.submit(worker, rng.randrange(1 << 30)) for _ in range(args.workers)]
            while not all(f.done() for f in futures):
                time.sleep(min(30, max(1, args.minutes * 6)))
                print(f"{time.time() - t0:7.1f} s  mixed: {dict(tally.counts)}", flush=True)
            for f in futures:
                f.result()

        m = check_idle(s, timeout_s=60)
        end_fds = fds(pid)
        five = sum(v for k, v in m.items() if k.startswith("dtensor_serve_http_responses_total") and 'status="5' in k)
        print(f"file descriptors of rank 0: {base_fds} after the first request, {end_fds} at the end; "
              f"5xx answers: {five:.0f}; generated tokens: {m['dtensor_serve_generated_tokens_total']:.0f}")
        assert not tally.failures, "\n".join(tally.failures)
        assert five == 0, "5xx answers"
        assert end_fds <= base_fds + 2, f"file descriptors: {base_fds} -> {end_fds}"
        os.kill(s.proc.pid, signal.SIGTERM)
        code = s.wait(120)
        out = s.output()
        assert code == 128 + signal.SIGTERM and "exited with status" not in out, f"dtrun {code}:\n{out[-3000:]}"
    print(f"OK: {sum(tally.counts.values())} requests over {time.time() - t0:.0f} s: {dict(tally.counts)}")


if __name__ == "__main__":
    main()
