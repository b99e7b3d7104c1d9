"""Python client of the troupe client protocol (messages/client.proto):
ZeroMQ DEALER to `troupe serve`'s ROUTER, one protobuf message per frame.

The client parts are imported on first use (PEP 562), so scripts that want
only `troupe_client.local_port` need neither pyzmq nor protobuf."""

import importlib

_WHERE = {
    "PROTOCOL_VERSION": "._common",
    "Chunk": "._common",
    "Pong": "._common",
    "Result": "._common",
    "TokenLogprob": "._common",
    "TroupeError": "._common",
    "AsyncClient": ".aio",
    "AsyncStream": ".aio",
    "Client": ".client",
    "Stream": ".client",
}

__all__ = sorted([*_WHERE, "client_pb2"])
__version__ = "0.1.0"


def __getattr__(name):
    if name == "client_pb2":
        return importlib.import_module(".client_pb2", __name__)
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
