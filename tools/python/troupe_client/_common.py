"""Shared pieces of the blocking and asyncio clients: building requests,
decoding replies, result types and errors."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import client_pb2 as pb

PROTOCOL_VERSION = pb.PROTOCOL_VERSION_CURRENT

# text, token ids, or chat messages ({"role", "content"} mappings or (role, content) pairs)
Prompt = Union[str, Sequence[int], Sequence[Union[Mapping[str, str], Tuple[str, str]]]]


class TroupeError(Exception):
    """An Error reply from the server (or a protocol violation seen by the client)."""

    def __init__(self, code: int, message: str, request_id: Optional[int] = None):
        self.code = code
        self.code_name = pb.ErrorCode.Name(code) if code in pb.ErrorCode.values() else str(code)
        self.message = message
        self.request_id = request_id
        where = f" (request {request_id})" if request_id is not None else ""
        super().__init__(f"{self.code_name}{where}: {message}")


@dataclasses.dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: List[Tuple[int, float]]


@dataclasses.dataclass
class Chunk:
    """One TokenChunk: generated token ids and the text delta they complete."""

    request_id: int
    token_ids: List[int]
    text: str
    logprobs: List[TokenLogprob]


@dataclasses.dataclass
class Result:
    """A finished request: the whole output and the Finished message's fields."""

    request_id: int
    text: str = ""
    token_ids: List[int] = dataclasses.field(default_factory=list)
    logprobs: List[TokenLogprob] = dataclasses.field(default_factory=list)
    finish_reason: str = ""  # stop, length, eos, cancelled, timeout, error
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    queue_ms: float = 0.0
    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    preemptions: int = 0
    stop_matched: str = ""
    error: str = ""
    accepted: bool = False
    embedding: List[float] = dataclasses.field(default_factory=list)  # embedding=True requests


@dataclasses.dataclass
class Pong:
    nonce: int
    model: str
    protocol_version: int
    rtt_ms: float
    admin_port: int = 0  # the server's admin endpoint port on its host; 0: none


def check_timeout(timeout: Optional[float], name: str = "timeout") -> Optional[float]:
    """None (wait forever) or a positive number of seconds; anything else is refused."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"{name} must be a positive number of seconds, or None to wait forever; got {timeout!r}")
    return float(timeout)


def _is_token_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def _chat_pair(m: Any, i: int) -> Tuple[str, str]:
    if isinstance(m, Mapping):
        missing = [k for k in ("role", "content") if k not in m]
        if missing:
            raise ValueError(f"prompt: chat message {i} has no {' or '.join(repr(k) for k in missing)}")
        role, content = m["role"], m["content"]
    elif isinstance(m, (tuple, list)) and len(m) == 2:
        role, content = m
    else:
        raise TypeError(
            f"prompt: item {i} is {type(m).__name__}; a list prompt holds token ids (int) or chat "
            "messages ({'role': ..., 'content': ...} or (role, content) pairs)"
        )
    if not isinstance(role, str) or not isinstance(content, str):
        raise TypeError(f"prompt: chat message {i}: role and content must be str")
    return role, content


def _set_field(target: Any, field: str, value: Any, name: str) -> None:
    """setattr on a protobuf message, with errors that name the parameter."""
    try:
        setattr(target, field, value)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{name}: {value!r} does not fit ({e})") from None


def build_generate(
    request_id: int,
    prompt: Prompt,
    *,
    max_tokens: Optional[int] = None,
    temperature: Optional[float] = None,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    min_p: Optional[float] = None,
    repetition_penalty: Optional[float] = None,
    presence_penalty: Optional[float] = None,
    frequency_penalty: Optional[float] = None,
    penalty_last_n: Optional[int] = None,
    seed: Optional[int] = None,
    logit_bias: Optional[Mapping[int, float]] = None,
    stop: Union[str, Iterable[str]] = (),
    stop_token_ids: Iterable[int] = (),
    ignore_eos: bool = False,
    stream: bool = True,
    offline: bool = False,
    priority: int = 0,
    deadline_ms: int = 0,
    logprobs: int = 0,
    embedding: bool = False,
    images: Iterable[bytes] = (),
    slo_ttft_ms: int = 0,
    slo_tpot_ms: int = 0,
    prompt_class: str = "",
) -> bytes:
    """The Generate frame; arguments are checked here, and a bad one raises
    ValueError or TypeError naming it (nothing is sent)."""
    msg = pb.ClientMessage(protocol_version=PROTOCOL_VERSION)
    g = msg.generate
    _set_field(g, "request_id", request_id, "request_id")
    if isinstance(prompt, str):
        g.text = prompt
    elif isinstance(prompt, (bytes, bytearray, memoryview)):
        raise TypeError("prompt: bytes are not a prompt; give text (str), token ids (list of int) or chat messages")
    elif prompt is None:
        pass  # no prompt: the server answers INVALID_ARGUMENT
    else:
        try:
            items = list(prompt)
        except TypeError:
            raise TypeError(f"prompt: {type(prompt).__name__} is not a prompt (str, token ids or chat messages)") from None
        if items and all(_is_token_id(t) for t in items):
            for i, t in enumerate(items):
                if not 0 <= t < 2**31:
                    raise ValueError(f"prompt: token id {t} (item {i}) is not in [0, 2**31)")
            g.tokens.ids.extend(items)
        elif items:
            for i, m in enumerate(items):
                role, content = _chat_pair(m, i)
                g.chat.messages.add(role=role, content=content)
        else:
            g.tokens.SetInParent()  # empty token prompt, refused by the server
    s = g.sampling
    for name, value in (
        ("temperature", temperature),
        ("top_k", top_k),
        ("top_p", top_p),
        ("min_p", min_p),
        ("repetition_penalty", repetition_penalty),
        ("presence_penalty", presence_penalty),
        ("frequency_penalty", frequency_penalty),
        ("penalty_last_n", penalty_last_n),
        ("seed", seed),
    ):
        if value is not None:
            _set_field(s, name, value, name)
    for t, b in (logit_bias or {}).items():
        if not _is_token_id(t) or not 0 <= t < 2**31:
            raise ValueError(f"logit_bias: key {t!r} is not a token id")
        if not isinstance(b, (int, float)) or isinstance(b, bool) or not -100 <= b <= 100:
            raise ValueError(f"logit_bias: the bias of token {t} must be a number in [-100, 100], got {b!r}")
        s.logit_bias[t] = float(b)
    if max_tokens is not None:
        _set_field(g, "max_tokens", max_tokens, "max_tokens")
    # One stop string is a str, not a sequence of one-character stops.
    stops = [stop] if isinstance(stop, str) else list(stop)
    for i, x in enumerate(stops):
        if not isinstance(x, str):
            raise TypeError(f"stop: item {i} is {type(x).__name__}; stop strings must be str")
    g.stop.extend(stops)
    ids = list(stop_token_ids)
    for i, t in enumerate(ids):
        if not _is_token_id(t):
            raise TypeError(f"stop_token_ids: item {i} is {type(t).__name__}, not int")
    try:
        g.stop_token_ids.extend(ids)
    except (ValueError, TypeError) as e:
        raise ValueError(f"stop_token_ids: {ids!r} does not fit ({e})") from None
    g.ignore_eos = bool(ignore_eos)
    g.stream = bool(stream)
    g.request_class = pb.OFFLINE if offline else pb.ONLINE
    _set_field(g, "priority", priority, "priority")
    _set_field(g, "deadline_ms", deadline_ms, "deadline_ms")
    _set_field(g, "logprobs", logprobs, "logprobs")
    # The prompt's pooled, normalised hidden states instead of a
    # generation (Result.embedding); generation options are refused with it.
    g.embedding = bool(embedding)
    # Images (PNG or JPEG bytes), one for each "<__media__>" in the prompt,
    # in order: for a server with a vision encoder (--mmproj).
    # Latency targets (0: the server's for the request's class) and the
    # output-length predictor's class, for servers that order admissions
    # by SLO (troupe serve --batch-order).
    _set_field(g, "slo_ttft_ms", slo_ttft_ms, "slo_ttft_ms")
    _set_field(g, "slo_tpot_ms", slo_tpot_ms, "slo_tpot_ms")
    if not isinstance(prompt_class, str):
        raise TypeError(f"prompt_class must be str, got {type(prompt_class).__name__}")
    g.prompt_class = prompt_class
    for i, image in enumerate(images):
        if not isinstance(image, (bytes, bytearray)):
            raise TypeError(f"images[{i}] must be bytes, got {type(image).__name__}")
        g.images.append(bytes(image))
    return msg.SerializeToString()


def build_cancel(request_id: int) -> bytes:
    msg = pb.ClientMessage(protocol_version=PROTOCOL_VERSION)
    msg.cancel.request_id = request_id
    return msg.SerializeToString()


def split_endpoints(endpoint: Union[str, Sequence[str]]) -> List[str]:
    """One endpoint, several in a list, or several in one string with commas."""
    items = endpoint.split(",") if isinstance(endpoint, str) else list(endpoint)
    out = [e.strip() for e in items if isinstance(e, str)]
    if not out or len(out) != len(items) or any(not e for e in out):
        raise ValueError(f"endpoints must be non-empty strings: {endpoint!r}")
    return out


def registry_services(url: str, cluster: Optional[str] = None, timeout: float = 2.0) -> List[str]:
    """The client endpoints of a cluster's services as its etcd registry
    (etcd://HOST:PORT[,HOST:PORT...]) lists them, the least loaded first
    (requests in flight per serving instance), as `troupe client --server
    etcd://...` ranks them.  cluster: its fingerprint; None: the one
    cluster the registry holds."""
    import base64
    import json
    import urllib.request

    if not url.startswith("etcd://"):
        raise ValueError(f"{url!r} is not etcd://HOST:PORT[,HOST:PORT...]")
    prefix = "/troupe/" + (cluster + "/" if cluster else "")
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps(
        {"key": base64.b64encode(prefix.encode()).decode(), "range_end": base64.b64encode(end.encode()).decode()}
    ).encode()
    errors = []
    for hostport in url[len("etcd://"):].split(","):
        try:
            req = urllib.request.Request(f"http://{hostport}/v3/kv/range", data=body, method="POST")
            with urllib.request.urlopen(req, timeout=timeout) as r:
                reply = json.loads(r.read())
            kvs = reply.get("kvs", []) if isinstance(reply, dict) else None
            if not isinstance(kvs, list):
                raise ValueError("not an etcd range reply")
            break
        except Exception as e:  # a bad address, a refused connection, a reply that is not etcd's
            errors.append(f"{hostport}: {e}")
    else:
        raise TroupeError(pb.UNAVAILABLE, "the registry does not answer: " + "; ".join(errors))
    services, clusters = [], set()
    for kv in kvs:
        try:
            parts = base64.b64decode(kv["key"]).decode(errors="replace").split("/")
        except (ValueError, KeyError, TypeError):
            continue
        if len(parts) < 5 or parts[1] != "troupe" or not parts[2]:
            continue
        clusters.add(parts[2])
        if parts[3] != "services":
            continue
        try:
            raw = base64.b64decode(kv.get("value", ""))
            if len(raw) > 64 << 10:
                continue
            rec = json.loads(raw)
            eps = rec["endpoints"]
            # As parse_service_record checks them: 1 to 16 printable strings.
            if not isinstance(eps, list) or not 1 <= len(eps) <= 16:
                continue
            if not all(isinstance(e, str) and 0 < len(e) <= 255 and e.isprintable() for e in eps):
                continue
            serving, in_flight = rec.get("serving", 0), rec.get("in_flight", 0)
            if not isinstance(serving, int) or not isinstance(in_flight, int):
                continue
            load = max(0, in_flight) / serving if serving > 0 else float("inf")
            services.append((parts[2], load, str(rec.get("id", "")), eps))
        except Exception:  # not a service record (bad base64, JSON, types, depth, size)
            continue
    if len(clusters) > 1:
        raise ValueError(f"the registry holds several clusters {sorted(clusters)}: name one")
    out: List[str] = []
    for _, _, _, eps in sorted(services, key=lambda s: (s[1], s[2])):
        out += [e for e in eps if e not in out]
    if not out:
        raise TroupeError(pb.UNAVAILABLE, f"the registry {url} lists no service")
    return out


def has_last_message(queue: Iterable[Any]) -> bool:
    """Whether a request's queued replies hold its last one (Finished or Error)."""
    return any(m.WhichOneof("body") in ("finished", "error") for m in queue)


def cancelled_message(request_id: int) -> Any:
    """A ServerMessage Finished (cancelled) for one request, made on the client side."""
    msg = pb.ServerMessage()
    msg.finished.request_id = request_id
    msg.finished.reason = pb.CANCELLED
    return msg


def error_message(request_id: int, code: int, message: str) -> Any:
    """A ServerMessage Error for one request, made on the client side."""
    msg = pb.ServerMessage()
    msg.error.code = code
    msg.error.message = message
    msg.error.request_id = request_id
    msg.error.has_request_id = True
    return msg


def build_ping(nonce: int) -> bytes:
    msg = pb.ClientMessage(protocol_version=PROTOCOL_VERSION)
    msg.ping.nonce = nonce
    return msg.SerializeToString()


def parse_server(frame: bytes) -> Any:
    msg = pb.ServerMessage()
    msg.ParseFromString(frame)
    return msg


def reply_request_id(msg: Any) -> Optional[int]:
    """The request a ServerMessage belongs to, or None (Pong, unattributed Error)."""
    kind = msg.WhichOneof("body")
    if kind in ("accepted", "chunk", "finished"):
        return getattr(msg, kind).request_id
    if kind == "error" and msg.error.has_request_id:
        return msg.error.request_id
    return None


def _logprobs(lps: Any) -> List[TokenLogprob]:
    return [TokenLogprob(lp.token, lp.logprob, [(t.token, t.logprob) for t in lp.top]) for lp in lps]


def to_chunk(c: Any) -> Chunk:
    return Chunk(c.request_id, list(c.token_ids), c.text, _logprobs(c.logprobs))


def add_chunk(result: Result, chunk: Chunk) -> None:
    result.token_ids.extend(chunk.token_ids)
    result.text += chunk.text
    result.logprobs.extend(chunk.logprobs)


def apply_finished(result: Result, f: Any) -> None:
    result.finish_reason = pb.FinishReason.Name(f.reason).lower()
    result.prompt_tokens = f.prompt_tokens
    result.completion_tokens = f.completion_tokens
    result.cached_tokens = f.cached_tokens
    result.queue_ms = f.queue_ms
    result.ttft_ms = f.ttft_ms
    result.tpot_ms = f.tpot_ms
    result.preemptions = f.preemptions
    result.stop_matched = f.stop_matched
    result.error = f.error
    result.embedding = list(f.embedding)


def error_of(msg: Any) -> TroupeError:
    e = msg.error
    return TroupeError(e.code, e.message, e.request_id if e.has_request_id else None)


def apply_reply(partial: Result, msg: Any) -> Tuple[Optional[Chunk], bool]:
    """Folds one ServerMessage of a request into `partial`: returns the Chunk
    it carried (None for other replies) and whether the request is over.
    Raises TroupeError for an Error reply."""
    kind = msg.WhichOneof("body")
    if kind == "accepted":
        partial.accepted = True
        partial.prompt_tokens = msg.accepted.prompt_tokens
    elif kind == "chunk":
        chunk = to_chunk(msg.chunk)
        add_chunk(partial, chunk)
        return chunk, False
    elif kind == "finished":
        apply_finished(partial, msg.finished)
        return None, True
    elif kind == "error":
        raise error_of(msg)
    return None, False


class StreamState:
    """What the blocking and asyncio streams share: the request's partial
    Result, folded one reply at a time.  Subclasses set _client, request_id,
    result and _partial."""

    _client: Any
    request_id: int
    result: Optional[Result]
    _partial: Result

    def _fold(self, msg: Any) -> Optional[Chunk]:
        """Applies one reply; returns its Chunk, if any.  On Finished sets
        `result`; on Finished or Error releases the request id (an Error
        is raised as TroupeError)."""
        try:
            chunk, over = apply_reply(self._partial, msg)
        except TroupeError:
            self._client._done(self.request_id)
            raise
        if over:
            self.result = self._partial
            self._client._done(self.request_id)
        return chunk
