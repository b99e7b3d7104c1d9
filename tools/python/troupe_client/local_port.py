"""A loopback port for a troupe process you start and tell to listen on it
(the tests and bench/ scripts start servers this way)."""

import pathlib
import random
import socket

_given_ports: set = set()
_port_draws = random.SystemRandom()  # not the global generator, which a test may seed


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now, for a child told to
    listen on it: drawn below the kernel's ephemeral range, where no bind to
    port 0 (the child's own ZeroMQ and admin listeners) can take it before
    the child does (tests/integration/server_process.hpp says more)."""
    lo, hi = 32768, 60999
    try:
        lo, hi = map(int, pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        pass
    ranges = [(10000, lo - 1)] if lo - 1 - 10000 >= 4096 else []
    if not ranges and 65535 - (hi + 1) >= 4096:
        ranges = [(hi + 1, 65535)]
    for first, last in ranges:
        for _ in range(2000):
            port = _port_draws.randint(first, last)
            if port in _given_ports:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _given_ports.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
