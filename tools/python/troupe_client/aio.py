"""asyncio client on zmq.asyncio: one DEALER socket, one reader task that
routes replies to the requests waiting for them."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, AsyncIterator, Dict, List, Optional

import zmq
import zmq.asyncio

from . import _common as c
from ._common import Chunk, Pong, Prompt, Result, TroupeError


class AsyncStream(c.StreamState):
    """A streaming request: `async for chunk in stream`; `result` when it ends."""

    def __init__(self, client: "AsyncClient", request_id: int, queue: "asyncio.Queue[Any]"):
        self._client = client
        self._queue = queue
        self.request_id = request_id
        self.result: Optional[Result] = None
        self._partial = Result(request_id)

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        while self.result is None:
            msg = await self._client._wait(self._queue)
            if isinstance(msg, BaseException):
                self._client._done(self.request_id)
                raise msg
            chunk = self._fold(msg)
            if chunk is not None:
                yield chunk

    async def cancel(self) -> bool:
        return await self._client.cancel(self.request_id)

    async def wait(self) -> Result:
        async for _ in self:
            pass
        assert self.result is not None
        return self.result


class AsyncClient:
    """asyncio client of `troupe serve`; many requests may run at once.

    >>> async with AsyncClient(endpoint) as cl:
    ...     results = await asyncio.gather(*(cl.generate(p, stream=False) for p in prompts))
    """

    def __init__(self, endpoint: str, timeout: Optional[float] = 120.0, context: Optional[zmq.asyncio.Context] = None):
        self.endpoint = endpoint
        self.timeout = c.check_timeout(timeout)
        self.connection_errors: List[TroupeError] = []  # Errors naming no request
        self._closed = False
        self._ctx = context or zmq.asyncio.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._ids = itertools.count(1)
        self._nonces = itertools.count(1)
        self._queues: Dict[int, "asyncio.Queue[Any]"] = {}
        self._pongs: Dict[int, "asyncio.Future[Any]"] = {}
        self._reader: Optional["asyncio.Task[None]"] = None

    async def generate(self, prompt: Prompt, *, stream: bool = True, request_id: Optional[int] = None, **options: Any):
        """stream=True: an AsyncStream; stream=False: the Result.  Options as Client.generate."""
        self._check_open()
        if request_id is None:
            request_id = next(self._ids)
            while request_id in self._queues:
                request_id = next(self._ids)
        elif request_id in self._queues:
            raise ValueError(f"request id {request_id} is in flight on this client")
        frame = c.build_generate(request_id, prompt, stream=stream, **options)
        q: "asyncio.Queue[Any]" = asyncio.Queue()
        self._queues[request_id] = q
        self._ensure_reader()
        await self._sock.send(frame)
        s = AsyncStream(self, request_id, q)
        return s if stream else await s.wait()

    async def cancel(self, request_id: int) -> bool:
        self._check_open()
        await self._sock.send(c.build_cancel(request_id))
        return request_id in self._queues

    async def ping(self, timeout: Optional[float] = None) -> Pong:
        self._check_open()
        t = self.timeout if timeout is None else c.check_timeout(timeout)
        nonce = next(self._nonces)
        fut = asyncio.get_running_loop().create_future()
        self._pongs[nonce] = fut
        self._ensure_reader()
        start = time.monotonic()
        await self._sock.send(c.build_ping(nonce))
        try:
            p = await asyncio.wait_for(fut, t)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no pong from {self.endpoint} in {t} s") from None
        finally:
            self._pongs.pop(nonce, None)
        return Pong(p.nonce, p.model, p.protocol_version, (time.monotonic() - start) * 1e3, p.admin_port)

    async def close(self) -> None:
        self._closed = True
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass
            self._reader = None
        self._sock.close(0)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- internals ---------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the client of {self.endpoint} is closed")

    def _done(self, request_id: int) -> None:
        self._queues.pop(request_id, None)

    async def _wait(self, q: "asyncio.Queue[Any]") -> Any:
        try:
            return await asyncio.wait_for(q.get(), self.timeout)
        except asyncio.TimeoutError:
            return TimeoutError(f"no reply from {self.endpoint} in {self.timeout} s")

    def _ensure_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    def _fail_all(self, exc: BaseException) -> None:
        for q in self._queues.values():
            q.put_nowait(exc)
        for f in self._pongs.values():
            if not f.done():
                f.set_exception(exc)

    async def _read_loop(self) -> None:
        try:
            while True:
                msg = c.parse_server(await self._sock.recv())
                kind = msg.WhichOneof("body")
                if kind == "pong":
                    f = self._pongs.get(msg.pong.nonce)
                    if f is not None and not f.done():
                        f.set_result(msg.pong)
                    continue
                rid = c.reply_request_id(msg)
                if rid is None:  # the connection's, not any one stream's
                    self.connection_errors.append(
                        c.error_of(msg) if kind == "error" else TroupeError(0, f"unexpected reply {kind}")
                    )
                    continue
                q = self._queues.get(rid)
                if q is not None:
                    q.put_nowait(msg)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # socket closed, undecodable frame
            self._fail_all(e)
