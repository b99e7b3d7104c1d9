#!/usr/bin/env bash
# Peer figures from llama.cpp, the speed and correctness reference for troupe.
#
#   LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin bash bench/peer_llamacpp.sh [bench|ppl|all]
#
# This script never builds or fetches llama.cpp: point LLAMA_CPP_BIN at the
# folder of an existing build (llama-bench, llama-perplexity). See
# docs/peer_llamacpp.md for the snapshot used and how the stories15M GGUF was
# made.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: LLAMA_CPP_BIN=DIR bash bench/peer_llamacpp.sh [bench|ppl|all] [--help]

Modes:
  bench   (default) llama-bench pp<N_PROMPT> and tg<N_GEN>, -t THREADS,
          -r REPS, -o json, on both models; prints a compact table
  ppl     llama-perplexity -c PPL_CTX -t THREADS -f PPL_TEXT on both models
  all     bench, then ppl

Environment (defaults in brackets):
  LLAMA_CPP_BIN   REQUIRED. Folder holding llama-bench and llama-perplexity
                  of an existing llama.cpp build. Never built by this script.
  TROUPE_MODEL_DIR  model cache [~/.cache/troupe/models]
  SMOLLM2_GGUF    SmolLM2 Q4_1 GGUF [$TROUPE_MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf]
  STORIES_GGUF    stories15M as an F32 GGUF [$TROUPE_MODEL_DIR/stories15M-f32.gguf]
                  (made from stories15M.bin, see docs/peer_llamacpp.md);
                  skipped with a note when the file is missing
  THREADS         threads [2]
  REPS            llama-bench repetitions [3]
  N_PROMPT        prompt tokens for pp [512]
  N_GEN           generated tokens for tg [128]
  PPL_CTX         perplexity context [128]
  PPL_TEXT        text for perplexity [${TROUPE_GOLDEN_DIR:-/work/shared/golden}/ppl_stories.txt]
  OUT_DIR         where raw JSON / logs are kept [a temporary folder, removed]
EOF
}

MODE="bench"
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    bench|ppl|all) MODE="$arg" ;;
    *) echo "peer_llamacpp: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

die() { echo "peer_llamacpp: $*" >&2; exit 1; }

if [ -z "${LLAMA_CPP_BIN:-}" ]; then
  die "LLAMA_CPP_BIN is not set. Set it to the folder of an existing llama.cpp build
  (the one holding llama-bench and llama-perplexity), e.g.
    LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin bash bench/peer_llamacpp.sh
  This script never builds llama.cpp."
fi
[ -d "$LLAMA_CPP_BIN" ] || die "LLAMA_CPP_BIN='$LLAMA_CPP_BIN' is not a folder"

MODEL_DIR="${TROUPE_MODEL_DIR:-$HOME/.cache/troupe/models}"
SMOLLM2_GGUF="${SMOLLM2_GGUF:-$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf}"
STORIES_GGUF="${STORIES_GGUF:-$MODEL_DIR/stories15M-f32.gguf}"
THREADS="${THREADS:-2}"
REPS="${REPS:-3}"
N_PROMPT="${N_PROMPT:-512}"
N_GEN="${N_GEN:-128}"
PPL_CTX="${PPL_CTX:-128}"
PPL_TEXT="${PPL_TEXT:-${TROUPE_GOLDEN_DIR:-/work/shared/golden}/ppl_stories.txt}"

command -v python3 >/dev/null || die "python3 is needed to read llama-bench JSON"

if [ -n "${OUT_DIR:-}" ]; then
  mkdir -p "$OUT_DIR"
else
  OUT_DIR="$(mktemp -d)"
  trap 'rm -rf "$OUT_DIR"' EXIT
fi

# name|path pairs of the models that exist
MODELS=()
add_model() {
  local name="$1" path="$2"
  if [ -f "$path" ]; then
    MODELS+=("$name|$path")
  else
    echo "peer_llamacpp: skipping $name: $path not found" >&2
  fi
}
add_model stories15M-F32 "$STORIES_GGUF"
add_model SmolLM2-135M-Q4_1 "$SMOLLM2_GGUF"
[ "${#MODELS[@]}" -gt 0 ] || die "no model found (set STORIES_GGUF / SMOLLM2_GGUF)"

need_tool() {
  [ -x "$LLAMA_CPP_BIN/$1" ] || die "$LLAMA_CPP_BIN/$1 not found or not executable"
}

run_bench() {
  need_tool llama-bench
  local entry name path json
  for entry in "${MODELS[@]}"; do
    name="${entry%%|*}"; path="${entry#*|}"
    json="$OUT_DIR/bench_$name.json"
    echo "peer_llamacpp: llama-bench $name (t=$THREADS, r=$REPS) ..." >&2
    "$LLAMA_CPP_BIN/llama-bench" -m "$path" -t "$THREADS" -p "$N_PROMPT" -n "$N_GEN" \
      -r "$REPS" -o json > "$json" 2> "$OUT_DIR/bench_$name.log" \
      || { cat "$OUT_DIR/bench_$name.log" >&2; die "llama-bench failed on $name"; }
  done
  python3 - "$OUT_DIR" "${MODELS[@]}" <<'EOF'
import json, statistics, sys
out_dir, entries = sys.argv[1], sys.argv[2:]
print(f"{'model':<20} {'test':<7} {'thr':>3} {'t/s avg':>10} {'± sd':>8} {'median':>10} {'best':>10}")
for entry in entries:
    name = entry.split("|", 1)[0]
    with open(f"{out_dir}/bench_{name}.json") as f:
        rows = json.load(f)
    for r in rows:
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        s = r.get("samples_ts") or [r["avg_ts"]]
        print(f"{name:<20} {test:<7} {r['n_threads']:>3} {r['avg_ts']:>10.1f} {r['stddev_ts']:>8.1f} "
              f"{statistics.median(s):>10.1f} {max(s):>10.1f}")
build = rows[0].get("build_commit", "?") if entries else "?"
print(f"(llama.cpp build {build}, {rows[0].get('cpu_info', '?')})")
EOF
}

run_ppl() {
  need_tool llama-perplexity
  [ -f "$PPL_TEXT" ] || die "PPL_TEXT '$PPL_TEXT' not found"
  local entry name path log ppl
  printf '%-20s %5s %-20s %s\n' model ctx PPL chunks
  for entry in "${MODELS[@]}"; do
    name="${entry%%|*}"; path="${entry#*|}"
    log="$OUT_DIR/ppl_$name.log"
    "$LLAMA_CPP_BIN/llama-perplexity" -m "$path" -c "$PPL_CTX" -t "$THREADS" -f "$PPL_TEXT" \
      > "$log" 2>&1 || { tail -20 "$log" >&2; die "llama-perplexity failed on $name"; }
    ppl="$(sed -n 's/^Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\).*/\1 ± \2/p' "$log")"
    printf '%-20s %5s %-20s %s\n' "$name" "$PPL_CTX" "${ppl:-?}" \
      "$(grep -oE '^\[1\].*' "$log" | tr -d '\n')"
  done
}

case "$MODE" in
  bench) run_bench ;;
  ppl) run_ppl ;;
  all) run_bench; echo; run_ppl ;;
esac
