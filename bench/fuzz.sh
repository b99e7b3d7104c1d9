#!/usr/bin/env bash
# libFuzzer runs of the parser harnesses (tests/fuzz, docs/fuzzing.md).
# Builds build-fuzz (clang, -DTROUPE_FUZZ=ON) when needed, then runs each
# target for SECONDS on a fresh copy of its seed corpus and prints its
# executions, exec/s, corpus size and findings.  One target at a time.
#
#   bench/fuzz.sh TARGET SECONDS     TARGET: regex, json_schema, openai_request,
#                                    admin_request, client_message, gguf, llama2c,
#                                    kv_blob, chat_template, or all (each in turn)
#
# Environment: FUZZ_SEED (libFuzzer -seed; the suite uses 1), FUZZ_ARGS
# (more libFuzzer flags), TROUPE_FUZZ_BUILD_DIR (default build-fuzz),
# FUZZ_JOBS (build jobs, default 2).  A finding's input is kept in
# BUILD/fuzz-runs/TARGET/artifacts/; replay it with BUILD/fuzz_TARGET FILE.
# Exit status: 0 when no target found anything.  Last line: "N passed, N failed".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${TROUPE_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
TARGETS=(regex json_schema openai_request admin_request client_message gguf llama2c kv_blob
         chat_template image)

usage() { sed -n '2,16p' "$0" >&2; exit 2; }
[ $# -eq 2 ] || usage
WHAT="$1"
SECONDS_EACH="$2"
[[ "$SECONDS_EACH" =~ ^[0-9]+$ ]] && [ "$SECONDS_EACH" -gt 0 ] || usage
if [ "$WHAT" = all ]; then
  RUN=("${TARGETS[@]}")
else
  [[ " ${TARGETS[*]} " == *" $WHAT "* ]] || { echo "unknown target '$WHAT'" >&2; usage; }
  RUN=("$WHAT")
fi

# --- build (configure once; the build itself is a no-op when up to date) ---
if [ ! -f "$BUILD/build.ninja" ]; then
  command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is missing (bash tools/setup.sh deps)" >&2; exit 2; }
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -G Ninja -DTROUPE_FUZZ=ON >/dev/null
fi
cmake --build "$BUILD" -j "${FUZZ_JOBS:-2}" >/dev/null || {
  echo "fuzz.sh: the build failed; rerun: cmake --build $BUILD" >&2
  exit 1
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load: $(cut -d' ' -f1-3 /proc/loadavg)"
passed=0
failed=0
for t in "${RUN[@]}"; do
  bin="$BUILD/fuzz_$t"
  run="$BUILD/fuzz-runs/$t"
  rm -rf "$run"
  mkdir -p "$run/corpus" "$run/artifacts"
  cp "$ROOT/tests/fuzz/corpus/$t/"* "$run/corpus/"
  args=(-max_total_time="$SECONDS_EACH" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$run/artifacts/")
  [ -n "${FUZZ_SEED:-}" ] && args+=(-seed="$FUZZ_SEED")
  # shellcheck disable=SC2206
  [ -n "${FUZZ_ARGS:-}" ] && args+=(${FUZZ_ARGS})
  echo "== $t: $bin ${args[*]} $run/corpus"
  rc=0
  "$bin" "${args[@]}" "$run/corpus" >"$run/log" 2>&1 || rc=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$run/log" | tail -1)"
  speed="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$run/log" | tail -1)"
  corpus="$(find "$run/corpus" -type f | wc -l)"
  corpus_kb="$(du -sk "$run/corpus" | cut -f1)"
  findings="$(find "$run/artifacts" -type f | wc -l)"
  echo "$t: ${execs:-?} executions, ${speed:-?} exec/s, corpus $corpus files (${corpus_kb} KiB), $findings finding(s), rc $rc, log $run/log"
  if [ "$rc" -ne 0 ] || [ "$findings" -ne 0 ]; then
    failed=$((failed + 1))
    grep -m3 -E 'ERROR: |SUMMARY: |runtime error:' "$run/log" | sed 's/^/  /' || true
    for a in "$run/artifacts/"*; do [ -f "$a" ] && echo "  finding: $a"; done
  else
    passed=$((passed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
