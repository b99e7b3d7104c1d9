#!/usr/bin/env bash
# The long run of the randomized torture test (tests/torture/torture.cpp):
# live `troupe serve` processes driven for DURATION seconds with a seeded
# mix of requests, cancels, deadlines, disconnects and bad frames.  Prints
# the tally as JSON and writes it to OUT.  Not part of CI (the suite runs
# 60 s of it).
#   bench/torture.sh [SEED] [DURATION_S] [OUT]     defaults: 7 1800 torture-SEED.json
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SEED="${1:-7}"
DURATION="${2:-1800}"
OUT="${3:-torture-$SEED.json}"
BIN="${TROUPE_BUILD_DIR:-$ROOT/build}/troupe_torture"
[ -x "$BIN" ] || { echo "build first: bash tools/setup.sh build" >&2; exit 2; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: $BIN --seed $SEED --duration $DURATION --json-out $OUT"
exec "$BIN" --seed "$SEED" --duration "$DURATION" --json-out "$OUT"
