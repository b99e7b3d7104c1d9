"""Blocking client: one DEALER socket, requests pipelined on it.

A Client is not thread-safe; use one per thread (or AsyncClient)."""

from __future__ import annotations

import collections
import itertools
import time
from typing import Any, Deque, Dict, Iterator, List, Optional

import zmq

from . import _common as c
from ._common import Chunk, Pong, Prompt, Result, TroupeError


class Stream(c.StreamState):
    """A streaming request: iterate for Chunks; `result` is set once it ends.

    Iteration raises TroupeError if the server refuses the request."""

    def __init__(self, client: "Client", request_id: int):
        self._client = client
        self.request_id = request_id
        self.result: Optional[Result] = None
        self._partial = Result(request_id)

    def __iter__(self) -> Iterator[Chunk]:
        while self.result is None:
            msg = self._client._next_for(self.request_id)
            chunk = self._fold(msg)
            if chunk is not None:
                yield chunk

    def cancel(self) -> bool:
        """Asks the server to end the request; iteration then ends with reason cancelled."""
        return self._client.cancel(self.request_id)

    def wait(self) -> Result:
        """Consumes the rest of the stream and returns the Result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result


class Client:
    """Blocking client of `troupe serve`.

    >>> with Client("tcp://127.0.0.1:5555") as cl:
    ...     for chunk in cl.generate("Once upon a time", max_tokens=16):
    ...         print(chunk.text, end="")
    """

    def __init__(self, endpoint: str, timeout: Optional[float] = 120.0, context: Optional[zmq.Context] = None):
        self.endpoint = endpoint
        self.timeout = c.check_timeout(timeout)  # seconds to wait for any one reply; None: forever
        self.connection_errors: List[TroupeError] = []  # Errors naming no request
        self._closed = False
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._ids = itertools.count(1)
        self._nonces = itertools.count(1)
        self._queues: Dict[int, Deque[Any]] = {}
        self._pongs: Dict[int, Any] = {}

    # -- public API --------------------------------------------------------

    def generate(self, prompt: Prompt, *, stream: bool = True, request_id: Optional[int] = None, **options: Any):
        """Sends a Generate.  stream=True: returns a Stream (an iterator of
        Chunks; `.result` when done).  stream=False: waits and returns the
        Result.  options: max_tokens, temperature, top_k, top_p, min_p,
        repetition_penalty, presence_penalty, frequency_penalty,
        penalty_last_n, seed, logit_bias ({token id: bias in [-100, 100]}),
        stop, stop_token_ids, ignore_eos, offline, priority, deadline_ms,
        logprobs, embedding (True: the prompt's embedding in Result.embedding,
        nothing generated)."""
        self._check_open()
        rid = self._new_id(request_id)
        frame = c.build_generate(rid, prompt, stream=stream, **options)
        self._queues[rid] = collections.deque()
        self._sock.send(frame)
        s = Stream(self, rid)
        return s if stream else s.wait()

    def cancel(self, request_id: int) -> bool:
        """Sends a Cancel.  True if the request is in flight on this client;
        otherwise the server's UNKNOWN_REQUEST reply is ignored, False."""
        self._check_open()
        self._sock.send(c.build_cancel(request_id))
        return request_id in self._queues

    def ping(self, timeout: Optional[float] = None) -> Pong:
        self._check_open()
        timeout = c.check_timeout(timeout) if timeout is not None else None
        nonce = next(self._nonces)
        start = time.monotonic()
        self._sock.send(c.build_ping(nonce))
        while nonce not in self._pongs:
            self._recv_one(timeout)
        p = self._pongs.pop(nonce)
        return Pong(p.nonce, p.model, p.protocol_version, (time.monotonic() - start) * 1e3, p.admin_port)

    def close(self) -> None:
        self._closed = True
        self._sock.close(0)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals ---------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the client of {self.endpoint} is closed")

    def _new_id(self, request_id: Optional[int]) -> int:
        if request_id is None:
            request_id = next(self._ids)
            while request_id in self._queues:
                request_id = next(self._ids)
        elif request_id in self._queues:
            raise ValueError(f"request id {request_id} is in flight on this client")
        return request_id

    def _done(self, request_id: int) -> None:
        self._queues.pop(request_id, None)

    def _next_for(self, request_id: int) -> Any:
        q = self._queues.get(request_id)
        if q is None:
            raise RuntimeError(f"request {request_id} is not in flight")
        self._check_open()
        while not q:
            self._recv_one(None)
        return q.popleft()

    def _recv_one(self, timeout: Optional[float]) -> None:
        t = self.timeout if timeout is None else timeout
        if t is not None and not self._sock.poll(int(t * 1000)):
            raise TimeoutError(f"no reply from {self.endpoint} in {t} s")
        msg = c.parse_server(self._sock.recv())
        kind = msg.WhichOneof("body")
        if kind == "pong":
            self._pongs[msg.pong.nonce] = msg.pong
            return
        rid = c.reply_request_id(msg)
        if rid is None:
            # An Error naming no request is the connection's, not the
            # stream's that happens to be reading: keep it for the caller.
            self.connection_errors.append(
                c.error_of(msg) if kind == "error" else TroupeError(0, f"unexpected reply {kind}")
            )
            return
        q = self._queues.get(rid)
        if q is not None:
            q.append(msg)
        # else: a reply for a request no longer tracked (e.g. UNKNOWN_REQUEST of a late cancel)
