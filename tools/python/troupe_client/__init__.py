"""Python client of the troupe client protocol (messages/client.proto):
ZeroMQ DEALER to `troupe serve`'s ROUTER, one protobuf message per frame."""

from ._common import PROTOCOL_VERSION, Chunk, Pong, Result, TokenLogprob, TroupeError
from .aio import AsyncClient, AsyncStream
from .client import Client, Stream
from . import client_pb2

__all__ = [
    "AsyncClient",
    "AsyncStream",
    "Chunk",
    "Client",
    "PROTOCOL_VERSION",
    "Pong",
    "Result",
    "Stream",
    "TokenLogprob",
    "TroupeError",
    "client_pb2",
]
__version__ = "0.1.0"
