"""Several services of one cluster (issue 37): two `troupe serve` processes
share one `troupe node`'s instances; the Python client and `troupe client`
take both endpoints and move to the second when the first falls silent."""

import json
import os
import signal
import subprocess

import pytest

from troupe_client import Client, TroupeError, client_pb2 as pb

from conftest import Server, offline_generate, read_stdout_until, troupe_bin
from troupe_client.local_port import free_port

PROMPT = "Once upon a time there was a dog"


class Node:
    def __init__(self, secret: str):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [troupe_bin(), "node", "--listen", f"127.0.0.1:{self.port}", "--cluster-secret-file", secret],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        line = read_stdout_until(self.proc, b"listening on", 60)
        if b"listening on" not in line:
            self.stop()
            pytest.fail(f"troupe node did not start: {line!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def two_services(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("python-failover-test-secret-0123456789")
    os.chmod(secret, 0o600)
    node = Node(str(secret))
    flags = ("--nodes", f"127.0.0.1:{node.port}", "--cluster-secret-file", str(secret))
    services = []
    try:
        services.append(Server(*flags))
        services.append(Server(*flags))
        yield services
    finally:
        for s in services:
            if s.proc.poll() is None:
                s.proc.kill()  # SIGKILL ends a stopped process too
            s.stop()
        node.stop()


def test_a_lost_service_moves_the_client_to_the_next(two_services):
    s1, s2 = two_services
    want = offline_generate(PROMPT, 200)["token_ids"]
    with Client([s1.endpoint, s2.endpoint], timeout=60, probe=0.5, lost_after=2.0) as cl:
        assert cl.endpoint == s1.endpoint
        assert cl.generate(PROMPT, max_tokens=24, stream=False).token_ids == want[:24]
        stream = cl.generate(PROMPT, max_tokens=200)
        next(iter(stream))  # it has shown a chunk: it cannot restart unseen
        os.kill(s1.proc.pid, signal.SIGSTOP)  # the first service falls silent
        waiting = cl.generate(PROMPT, max_tokens=200, stream=False, request_id=77)
        assert waiting.token_ids == want, "the request sent again to the second service"
        assert cl.endpoint == s2.endpoint and cl.failovers == 1
        with pytest.raises(TroupeError) as e:
            stream.wait()
        assert e.value.code == pb.UNAVAILABLE and "mid-stream" in e.value.message
        assert cl.generate(PROMPT, max_tokens=24, stream=False).token_ids == want[:24]


def test_troupe_client_takes_several_endpoints(two_services):
    s1, s2 = two_services
    want = offline_generate(PROMPT, 64)["token_ids"]
    os.kill(s1.proc.pid, signal.SIGSTOP)
    out = subprocess.run(
        [troupe_bin(), "client", "--server", f"{s1.endpoint},{s2.endpoint}", "-p", PROMPT, "-n", "64", "--json"],
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr.decode()
    assert json.loads(out.stdout)["token_ids"] == want


def test_endpoints_are_checked():
    with pytest.raises(ValueError):
        Client("tcp://127.0.0.1:1,,tcp://127.0.0.1:2")
    with pytest.raises(TroupeError):  # none answers
        Client(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], lost_after=0.3)


def test_a_failover_never_changes_models():
    a = Server()  # stories15m
    b = Server(model="smollm2-135m-instruct")
    try:
        with Client([a.endpoint, b.endpoint], timeout=60, probe=0.5, lost_after=2.0) as cl:
            assert cl.endpoint == a.endpoint
            os.kill(a.proc.pid, signal.SIGSTOP)
            with pytest.raises(TroupeError) as e:
                cl.generate(PROMPT, max_tokens=8, stream=False)
            assert e.value.code == pb.UNAVAILABLE, "b answers, but serves another model"
            assert cl.failovers == 0
    finally:
        for s in (a, b):
            if s.proc.poll() is None:
                s.proc.kill()
            s.stop()
