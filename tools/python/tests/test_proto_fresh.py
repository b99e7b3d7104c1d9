"""troupe_client/client_pb2.py must be what gen_proto.sh makes of messages/client.proto."""

import pathlib
import shutil
import subprocess

import pytest

from troupe_client import client_pb2

HERE = pathlib.Path(__file__).resolve().parent
PKG = HERE.parent
REPO = PKG.parent.parent


@pytest.mark.skipif(shutil.which("protoc") is None, reason="protoc is not installed")
def test_generated_module_is_fresh(tmp_path):
    subprocess.run(["bash", str(PKG / "gen_proto.sh"), str(tmp_path)], check=True)
    fresh = (tmp_path / "client_pb2.py").read_text()
    committed = (PKG / "troupe_client" / "client_pb2.py").read_text()
    assert fresh == committed, "client_pb2.py is stale: run tools/python/gen_proto.sh"


def test_descriptor_names_every_proto_message():
    # Without protoc: every message and enum declared in the .proto is in the module.
    import re

    src = (REPO / "messages" / "client.proto").read_text()
    declared = set(re.findall(r"^\s*(?:message|enum)\s+(\w+)", src, re.M))
    have = set(client_pb2.DESCRIPTOR.message_types_by_name) | set(client_pb2.DESCRIPTOR.enum_types_by_name)
    assert declared == have
