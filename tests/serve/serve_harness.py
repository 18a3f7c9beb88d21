"""Starting `dtensor serve` for the end-to-end and soak tests (tests/serve/*_test.py): under dtrun
at any tp, on a free port, and finding its ranks' processes; the checks they share (back to idle,
drain on SIGTERM) and `generate`'s tokens to compare with. Standard library only.

    with Served(dtensor, dtrun, model, tp=2) as s:
        s.url            # http://127.0.0.1:PORT
        s.rank_pid(0)    # rank 0's process (dtrun's child with RANK=0)
        s.get("/health"), s.post("/v1/completions", {...})

Exit code 77 tells ctest a test skipped (SKIP_RETURN_CODE).
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import http.client

SKIP = 77


def skip(why):
    print(f"skipped: {why}")
    sys.exit(SKIP)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def serve_args(doc, generate=True, extra=()):
    """The flags of a serve test: the programs, the model, tp, and `extra` (flag, type, default)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ("--dtensor", "--dtrun") + (("--generate",) if generate else ()) + ("--model",):
        p.add_argument(flag, required=True)
    p.add_argument("--tp", type=int, default=1)
    for flag, kind, default in extra:
        p.add_argument(flag, type=kind, default=default)
    return p.parse_args()


def openai_or_skip():
    """The `openai` package, or a skip where the reference venv lacks it."""
    try:
        import openai
    except ImportError:
        skip("the openai package is not installed (tools/reference/requirements.txt)")
    return openai


# Note [Reading dtrun's last lines]
# dtrun's output is read by a thread of its own (the test talks to the server meanwhile), so when
# dtrun exits the reader may not yet have read its last lines from the pipe: on a loaded machine
# (ctest -j2 beside builds) check_drain found dtrun's 143 but not rank 0's "serve: stopped",
# written just before. wait() therefore joins the reader, which ends at the pipe's end: dtrun's
# ranks write into pipes of dtrun's, so the pipe ends when dtrun does.
class Served:
    def __init__(self, dtensor, dtrun, model, tp=1, flags=(), env=None, grace_s=30, start_timeout_s=120):
        self.tp = tp
        cmd = [dtrun, "--nproc-per-node", str(tp), "--grace-period", str(grace_s), dtensor, "serve",
               "--model", model, "--port", "0", *flags]
        full_env = dict(os.environ, DT_BACKEND="shm", **(env or {}))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=full_env, start_new_session=True)
        self.lines = []
        self._port = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(start_timeout_s) or self._port is None:
            self.kill()
            raise RuntimeError("the server did not start:\n" + "".join(self.lines))
        self.host = "127.0.0.1"
        self.url = f"http://{self.host}:{self._port}"

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            m = re.search(r"serve: \S+ on http://[^:]+:(\d+)", line)
            if m:
                self._port = int(m.group(1))
                self._ready.set()
        self._ready.set()

    @property
    def port(self):
        return self._port

    def output(self):
        return "".join(self.lines)

    def rank_pid(self, rank):
        """The process of `rank`: a child of dtrun whose environment says RANK=rank."""
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != self.proc.pid:
                    continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                if f"RANK={rank}".encode() in env:
                    return int(pid)
            except (OSError, ValueError, IndexError):
                continue
        raise RuntimeError(f"no rank {rank} under dtrun (pid {self.proc.pid})")

    def wait(self, timeout_s):
        """dtrun's exit status, or None if it has not ended within timeout_s. Once it has, output()
        holds all it wrote: see Note [Reading dtrun's last lines]."""
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(timeout_s)
        return code

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        self._reader.join(5)

    # Plain HTTP (one connection per call).
    def request(self, method, path, body=None, timeout_s=120, headers=None):
        conn = http.client.HTTPConnection(self.host, self._port, timeout=timeout_s)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        out = (r.status, r.read().decode("utf-8", "replace"))
        conn.close()
        return out

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def metrics(self):
        """/metrics as {name{labels}: value}."""
        status, text = self.get("/metrics")
        assert status == 200, text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out


def sse_payloads(body):
    """The payloads of a server-sent event stream, checking its framing."""
    assert body.endswith("\n\n"), body[-200:]
    events = [e for e in body.split("\n\n") if e]
    for e in events:
        assert e.startswith("data: "), e
    return [e[len("data: "):] for e in events]


def stream_text(payloads):
    """The text of a streamed answer and its finish reason (checking [DONE] ends it)."""
    assert payloads[-1] == "[DONE]", payloads[-3:]
    text, finish = "", None
    for p in payloads[:-1]:
        chunk = json.loads(p)
        assert "error" not in chunk, chunk
        for c in chunk["choices"]:
            text += c.get("text") or c.get("delta", {}).get("content") or ""
            finish = c.get("finish_reason") or finish
    return text, finish


def check_idle(s, timeout_s=10):
    """/metrics back to idle within timeout_s (returned): no open, running or waiting request, no KV
    page in use."""
    deadline = time.time() + timeout_s
    while True:
        m = s.metrics()
        idle = (m["dtensor_serve_requests_open"], m["dtensor_serve_kv_pages_used"],
                m["dtensor_serve_requests_running"], m["dtensor_serve_requests_waiting"])
        if idle == (0, 0, 0, 0):
            return m
        check(time.time() < deadline, f"not idle after {timeout_s} s: open, pages, running, waiting = {idle}")
        time.sleep(0.1)


def check_drain(s, name, max_tokens=200):
    """SIGTERM while a stream runs: it finishes, then every rank exits 0."""
    conn = http.client.HTTPConnection(s.host, s.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"model": name, "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0, "stream": True}),
        headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    check(r.status == 200, r.status)
    first = r.readline()  # the stream is under way
    check(first.startswith(b"data: "), first)
    os.kill(s.proc.pid, signal.SIGTERM)  # dtrun forwards it to every rank; rank 0 drains
    rest = r.read().decode()
    text, finish = stream_text(sse_payloads(first.decode() + rest))
    check(finish in ("stop", "length"), finish)
    status = s.wait(60)
    out = s.output()
    check(status == 128 + signal.SIGTERM, f"dtrun exited {status}:\n{out}")
    check("exited with status" not in out and "killed by signal" not in out, out)
    check("serve: stopped" in out, out)


def decode(dtensor, model, ids):
    """The text of token ids, by `dtensor tokenize --decode`."""
    if not ids:
        return ""
    out = subprocess.run([dtensor, "tokenize", "--model", model, "--decode", ",".join(map(str, ids))],
                         capture_output=True, text=True, check=True, timeout=60)
    return out.stdout[:-1]  # its newline


def generate_ids(generate, model, flags, dtrun=None, tp=1, timeout_s=120):
    """`generate`'s prompt ids and generated ids (--print-ids), alone or under dtrun at tp ranks."""
    cmd = [generate, "--model", model, "--quiet", "--print-ids", *flags]
    if dtrun is not None:
        cmd = [dtrun, "--nproc-per-node", str(tp), *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                         env=dict(os.environ, DT_BACKEND="shm"))
    check(out.returncode == 0, f"{cmd} exited {out.returncode}:\n{out.stdout}{out.stderr}")
    found = [re.search(rf"{what} ids (\[[0-9, ]*\])", out.stdout) for what in ("prompt", "generated")]
    check(all(found), f"{cmd} printed no ids:\n{out.stdout}")
    return [json.loads(m.group(1)) for m in found]


def shown_ids(ids, finish, completion_tokens):
    """The ids of generate's tokens that an answer of completion_tokens shows: a stop token ends the
    server's answer (counted, its text not shown), where generate goes on after it."""
    return ids[:completion_tokens] if finish == "length" else ids[:completion_tokens - 1]
