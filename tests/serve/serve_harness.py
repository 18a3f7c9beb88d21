"""Starting `dtensor serve` for the end-to-end and soak tests (tests/serve/*_test.py): under dtrun
at any tp, on a free port, and finding its ranks' processes. Standard library only.

    with Served(dtensor, dtrun, model, tp=2) as s:
        s.url            # http://127.0.0.1:PORT
        s.rank_pid(0)    # rank 0's process (dtrun's child with RANK=0)
        s.get("/health"), s.post("/v1/completions", {...})

Exit code 77 tells ctest a test skipped (SKIP_RETURN_CODE).
"""
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
        """dtrun's exit status, or None if it has not ended within timeout_s."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

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
