"""Blocking client: one DEALER socket, requests pipelined on it.

A Client is not thread-safe; use one per thread (or AsyncClient)."""

from __future__ import annotations

import collections
import itertools
import time
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Set, Union

import zmq

from . import _common as c
from ._common import Chunk, Pong, Prompt, Result, TroupeError


def pb_unavailable() -> int:
    return c.pb.UNAVAILABLE


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

    Several endpoints (a list, or one string with commas): `troupe serve`
    processes of one cluster, which share its instances.  The client talks
    to the first that answers a ping; when it falls silent (pings
    unanswered for `lost_after` seconds) it moves to the next that answers
    and sends again every request whose stream has shown nothing yet
    (non-streaming requests always); a stream that had yielded chunks ends
    with TroupeError UNAVAILABLE instead, since its text would restart.
    """

    def __init__(
        self,
        endpoint: Union[str, Sequence[str]],
        timeout: Optional[float] = 120.0,
        context: Optional[zmq.Context] = None,
        *,
        probe: float = 1.0,
        lost_after: float = 3.0,
    ):
        self.endpoints = c.split_endpoints(endpoint)
        self.timeout = c.check_timeout(timeout)  # seconds to wait for any one reply; None: forever
        self.probe = c.check_timeout(probe, "probe")
        self.lost_after = c.check_timeout(lost_after, "lost_after")
        self.connection_errors: List[TroupeError] = []  # Errors naming no request
        self.failovers = 0  # services lost and replaced by another endpoint
        self._closed = False
        self._ctx = context or zmq.Context.instance()
        self._ids = itertools.count(1)
        self._nonces = itertools.count(1)
        self._queues: Dict[int, Deque[Any]] = {}
        self._pongs: Dict[int, Any] = {}
        self._frames: Dict[int, bytes] = {}  # what each request in flight sent (resent on failover)
        self._shown: Set[int] = set()  # streams that have yielded a chunk
        self._cancelled: Set[int] = set()  # requests the caller cancelled
        self._pinging: Set[int] = set()  # ping() nonces not answered yet
        self._model: Optional[str] = None  # what the first service served (several endpoints)
        at = 0 if len(self.endpoints) == 1 else self._first_answering(0)
        if at is None:
            raise TroupeError(pb_unavailable(), f"no endpoint of {self.endpoints} answers a ping")
        self._connect(at)

    @classmethod
    def from_registry(cls, registry: str, cluster: Optional[str] = None, **kwargs: Any) -> "Client":
        """A client of the services a cluster's etcd registry lists
        (etcd://HOST:PORT), the least loaded first, failing over among them."""
        return cls(c.registry_services(registry, cluster), **kwargs)

    # -- public API --------------------------------------------------------

    def generate(self, prompt: Prompt, *, stream: bool = True, request_id: Optional[int] = None, **options: Any):
        """Sends a Generate.  stream=True: returns a Stream (an iterator of
        Chunks; `.result` when done).  stream=False: waits and returns the
        Result.  options: max_tokens, temperature, top_k, top_p, min_p,
        repetition_penalty, presence_penalty, frequency_penalty,
        penalty_last_n, seed, logit_bias ({token id: bias in [-100, 100]}),
        stop, stop_token_ids, ignore_eos, offline, priority, deadline_ms,
        logprobs, embedding (True: the prompt's embedding in Result.embedding,
        nothing generated), images (PNG or JPEG bytes, one for each
        "<__media__>" in the prompt), slo_ttft_ms and slo_tpot_ms (this
        request's latency targets), prompt_class (its class for the
        server's output-length predictor, at most 128 bytes)."""
        self._check_open()
        rid = self._new_id(request_id)
        frame = c.build_generate(rid, prompt, stream=stream, **options)
        self._queues[rid] = collections.deque()
        self._frames[rid] = frame
        self._sock.send(frame)
        s = Stream(self, rid)
        return s if stream else s.wait()

    def cancel(self, request_id: int) -> bool:
        """Sends a Cancel.  True if the request is in flight on this client;
        otherwise the server's UNKNOWN_REQUEST reply is ignored, False."""
        self._check_open()
        self._sock.send(c.build_cancel(request_id))
        if request_id in self._queues:
            self._cancelled.add(request_id)
        return request_id in self._queues

    def ping(self, timeout: Optional[float] = None) -> Pong:
        self._check_open()
        timeout = c.check_timeout(timeout) if timeout is not None else None
        nonce = next(self._nonces)
        start = time.monotonic()
        self._sock.send(c.build_ping(nonce))
        self._pinging.add(nonce)
        try:
            while nonce not in self._pongs:
                self._recv_one(timeout)
        finally:
            self._pinging.discard(nonce)
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
        self._frames.pop(request_id, None)
        self._shown.discard(request_id)
        self._cancelled.discard(request_id)

    def _connect(self, at: int) -> None:
        self._at = at
        self.endpoint = self.endpoints[at]
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.connect(self.endpoint)
        except zmq.ZMQError as e:
            self._sock.close(0)
            raise ValueError(f"cannot connect to {self.endpoint!r}: {e}") from None

    def _first_answering(self, start: int) -> Optional[int]:
        """The endpoint from `start` on, in turn, to talk to: all are pinged
        at once; the first in that order that answers (within 0.1 s of the
        fastest answer, lost_after in all) and serves the model of the
        first service this client used (a failover never changes models)."""
        n = len(self.endpoints)
        order = [(start + k) % n for k in range(n)]
        socks: Dict[int, Any] = {}
        served: Dict[int, str] = {}
        poller = zmq.Poller()
        try:
            for i in order:
                sock = self._ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                try:
                    sock.connect(self.endpoints[i])
                    sock.send(c.build_ping(0))
                except zmq.ZMQError:
                    sock.close(0)  # not an endpoint ZeroMQ can dial
                    continue
                socks[i] = sock
                poller.register(sock, zmq.POLLIN)
            fits = lambda i: i in served and (self._model is None or served[i] == self._model)
            deadline = time.monotonic() + self.lost_after
            grace = False
            while len(served) < len(socks):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for sock, _ in poller.poll(int(left * 1000) + 1):
                    i = next(k for k, s in socks.items() if s is sock)
                    try:
                        msg = c.parse_server(sock.recv(zmq.NOBLOCK))
                    except Exception:
                        poller.unregister(sock)
                        served[i] = "\0"  # not the protocol: fits no model
                        continue
                    if msg.WhichOneof("body") == "pong":
                        served[i] = msg.pong.model
                        poller.unregister(sock)
                if not grace and any(fits(i) for i in order):
                    grace = True
                    deadline = min(deadline, time.monotonic() + 0.1)
            for i in order:
                if fits(i):
                    if self._model is None:
                        self._model = served[i]
                    return i
            return None
        finally:
            for sock in socks.values():
                sock.close(0)

    def _failover(self) -> None:
        """The service in use is lost: move to the next that answers and
        send again the requests in flight that the caller has seen nothing
        of; a stream that showed chunks ends with UNAVAILABLE, a cancelled
        request as cancelled, one whose last message came already as it
        came.  When no endpoint answers, every open request ends with
        UNAVAILABLE and TroupeError is raised."""
        lost = self.endpoint
        self._sock.close(0)
        nxt = self._first_answering(self._at + 1)
        open_ = [(rid, q) for rid, q in self._queues.items() if not c.has_last_message(q)]
        if nxt is None:
            self._connect(self._at)  # a socket again: the lost service may come back
            why = f"the service at {lost} was lost and no endpoint answers"
            for rid, q in open_:
                q.append(c.error_message(rid, pb_unavailable(), why))
            raise TroupeError(pb_unavailable(), why)
        self._connect(nxt)
        self.failovers += 1
        for rid, q in open_:
            if rid in self._cancelled:
                q.clear()
                q.append(c.cancelled_message(rid))
            elif rid in self._shown:
                q.append(c.error_message(rid, pb_unavailable(), f"the service at {lost} was lost mid-stream"))
            else:
                q.clear()
                self._sock.send(self._frames[rid])
        for nonce in self._pinging:
            self._sock.send(c.build_ping(nonce))

    def _next_for(self, request_id: int) -> Any:
        q = self._queues.get(request_id)
        if q is None:
            raise RuntimeError(f"request {request_id} is not in flight")
        self._check_open()
        while not q:
            self._recv_one(None)
        msg = q.popleft()
        if msg.WhichOneof("body") == "chunk":
            self._shown.add(request_id)
        return msg

    def _wait_readable(self, t: Optional[float]) -> bool:
        """Waits up to t seconds (None: forever) for a frame.  With several
        endpoints, pings a silent service and fails over once it is lost."""
        if len(self.endpoints) == 1:
            return t is None or bool(self._sock.poll(int(t * 1000)))
        start = heard = time.monotonic()
        pinged = start - self.probe
        while True:
            now = time.monotonic()
            if t is not None and now - start >= t:
                return False
            if now - heard >= self.lost_after:
                self._failover()
                start = heard = time.monotonic()
                pinged = start - self.probe
                continue
            if now - heard >= self.probe and now - pinged >= self.probe:
                self._sock.send(c.build_ping(0))  # nonce 0: a liveness probe, not ping()'s
                pinged = now
            if self._sock.poll(200):
                msg = c.parse_server(self._sock.recv(zmq.NOBLOCK))
                heard = time.monotonic()
                if msg.WhichOneof("body") == "pong" and msg.pong.nonce == 0:
                    continue
                self._take(msg)
                return True

    def _recv_one(self, timeout: Optional[float]) -> None:
        t = self.timeout if timeout is None else timeout
        if len(self.endpoints) > 1:
            if not self._wait_readable(t):
                raise TimeoutError(f"no reply from {self.endpoint} in {t} s")
            return
        if t is not None and not self._sock.poll(int(t * 1000)):
            raise TimeoutError(f"no reply from {self.endpoint} in {t} s")
        self._take(c.parse_server(self._sock.recv()))

    def _take(self, msg: Any) -> None:
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
