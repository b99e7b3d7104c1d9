#!/usr/bin/env bash
# Regenerates troupe_client/client_pb2.py from messages/client.proto with
# protoc (Debian's protobuf-compiler, 3.21).  The generated module is
# committed; tests/test_proto_fresh.py fails when it is stale.
#   tools/python/gen_proto.sh [OUT_DIR]   (default: tools/python/troupe_client)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${1:-$HERE/troupe_client}"
PROTOC="${PROTOC:-protoc}"
mkdir -p "$OUT"
"$PROTOC" -I "$ROOT/messages" --python_out="$OUT" "$ROOT/messages/client.proto"
