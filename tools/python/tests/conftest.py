"""Fixtures: a real `troupe serve` on loopback with the stories15m model.

TROUPE_BIN names the binary (default: build/troupe in the repository);
models come from TROUPE_MODEL_DIR as for the C++ tests."""

import json
import os
import pathlib
import select
import subprocess
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
MODEL = "stories15m"


def troupe_bin() -> str:
    b = os.environ.get("TROUPE_BIN") or str(REPO / "build" / "troupe")
    if not os.path.isabs(b):
        b = str(REPO / b)
    if not os.access(b, os.X_OK):
        pytest.fail(f"troupe binary not found at {b} (set TROUPE_BIN)")
    return b


def read_stdout_until(proc: subprocess.Popen, marker: bytes, seconds: float) -> bytes:
    """What a child printed on stdout until `marker` (bounded; less when it exits)."""
    out, until = b"", time.monotonic() + seconds
    while marker not in out and time.monotonic() < until:
        r, _, _ = select.select([proc.stdout], [], [], 0.2)
        if r:
            data = os.read(proc.stdout.fileno(), 4096)
            if not data:
                break
            out += data
    return out


class Server:
    READY = "troupe serve: listening on "

    def __init__(self, *extra: str, model: str = MODEL):
        self.err = tempfile.NamedTemporaryFile(prefix="troupe_py_serve_", suffix=".err", delete=False)
        self.proc = subprocess.Popen(
            [troupe_bin(), "serve", "-m", model, "--listen", "tcp://127.0.0.1:*", *extra],
            stdout=subprocess.PIPE,
            stderr=self.err,
        )
        text = read_stdout_until(self.proc, b"\n", 90).decode(errors="replace")
        if not text.startswith(self.READY):
            self.stop()
            pytest.fail(f"troupe serve did not get ready: {text!r}\n{self.stderr()}")
        self.endpoint = text[len(self.READY):].split()[0]

    def stderr(self) -> str:
        return pathlib.Path(self.err.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.err.close()
        os.unlink(self.err.name)


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def endpoint(server):
    return server.endpoint


def offline_generate(prompt: str, max_tokens: int) -> dict:
    """`troupe generate --json`: the reference greedy answer."""
    out = subprocess.run(
        [troupe_bin(), "generate", "-m", MODEL, "-p", prompt, "-n", str(max_tokens), "--json"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return json.loads(out.stdout)
