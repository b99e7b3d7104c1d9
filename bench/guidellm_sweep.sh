#!/usr/bin/env bash
# guidellm_sweep.sh: load-test `troupe serve` (and, optionally, llama-server on the
# same GGUF) with guidellm's sweep profile, one server after the other, under the
# same guidellm command. A heavy benchmark (about 6-8 minutes per server on 2
# cores), run by hand; NOT part of CI.
#
# Setup, once, outside the repo (guidellm needs a tokenizer; offline, take the GGUF's):
#   python3 -m venv /work/peer/guidellm-venv
#   /work/peer/guidellm-venv/bin/pip install guidellm==0.8.1 gguf
#   HF_HUB_OFFLINE=1 /work/peer/guidellm-venv/bin/python -c "from transformers import \
#     AutoTokenizer as T; T.from_pretrained('$HOME/.cache/troupe/models', \
#     gguf_file='SmolLM2-135M-Instruct.Q4_1.gguf').save_pretrained('/work/peer/smollm2-tokenizer')"
# Run:
#   GUIDELLM=/work/peer/guidellm-venv/bin/guidellm TOKENIZER=/work/peer/smollm2-tokenizer \
#   LLAMA_SERVER=/path/to/llama-server bench/guidellm_sweep.sh OUTDIR
# OUTDIR gets, per server: NAME.json and NAME.csv (guidellm), NAME.console.txt (its
# tables), NAME.server.log; and summary.md (one line per benchmark of each sweep).
set -uo pipefail

OUT=${1:?usage: $0 OUTDIR}
GUIDELLM=${GUIDELLM:?set GUIDELLM to the guidellm executable}
TOKENIZER=${TOKENIZER:?set TOKENIZER to a Hugging Face tokenizer folder}
TROUPE_BIN=${TROUPE_BIN:-build/troupe}
LLAMA_SERVER=${LLAMA_SERVER:-}                 # empty: troupe only
MODEL=${MODEL:-$HOME/.cache/troupe/models/SmolLM2-135M-Instruct.Q4_1.gguf}
MAX_SECONDS=${MAX_SECONDS:-60}                 # each benchmark of the sweep (too short: the
                                               # throughput one completes nothing and the sweep aborts)
SWEEP_SIZE=${SWEEP_SIZE:-6}                    # synchronous, throughput, SWEEP_SIZE-2 constant rates
MAX_CONCURRENCY=${MAX_CONCURRENCY:-8}          # client-side cap on requests in flight
DATA=${DATA:-prompt_tokens=256,output_tokens=64}
THREADS=${THREADS:-2}
LLAMA_ARGS=${LLAMA_ARGS:--np 8 -c 4096}        # 8 slots of 512 tokens, as many as MAX_CONCURRENCY
PORT=${PORT:-18431}
HEALTH_WAIT_S=${HEALTH_WAIT_S:-180}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$OUT"

PID=
stop_server() {
    [ -n "$PID" ] || return 0
    kill "$PID" 2>/dev/null
    for _ in $(seq 30); do kill -0 "$PID" 2>/dev/null || break; sleep 1; done
    kill -9 "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; PID=
}
trap stop_server EXIT
trap 'exit 130' INT TERM

run_sweep() {  # NAME SERVER-COMMAND...: start it on $PORT, sweep it, stop it
    local name=$1 url="http://127.0.0.1:$PORT" model; shift
    "$@" >"$OUT/$name.server.log" 2>&1 &
    PID=$!
    for ((i = 0; ; i++)); do
        curl -sf -m 2 "$url/health" >/dev/null && break
        if ((i >= HEALTH_WAIT_S)) || ! kill -0 "$PID" 2>/dev/null; then
            echo "$name: no /health within ${HEALTH_WAIT_S}s (see $OUT/$name.server.log)" >&2
            stop_server; return 1
        fi
        sleep 1
    done
    model=$(curl -sf -m 5 "$url/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
    echo "== $name: $url model=$model" | tee "$OUT/$name.console.txt"
    "$GUIDELLM" run --disable-progress \
        --backend "kind=openai_http,target=$url,model=$model" \
        --tokenizer "kind=hf_auto,model=$TOKENIZER" \
        --data "kind=synthetic_text,$DATA" \
        --profile "kind=sweep,sweep_size=$SWEEP_SIZE,max_concurrency=$MAX_CONCURRENCY" \
        --constraint "kind=max_duration,seconds=$MAX_SECONDS" \
        --output "kind=json,path=$OUT/$name.json" --output "kind=csv,path=$OUT/$name.csv" \
        --output kind=console 2>&1 | tee -a "$OUT/$name.console.txt"
    local rc=$?
    stop_server
    return $rc
}

rc=0
run_sweep troupe "$TROUPE_BIN" serve -m "$MODEL" --http-port "$PORT" -l 'tcp://127.0.0.1:*' || rc=1
if [ -n "$LLAMA_SERVER" ]; then
    # shellcheck disable=SC2086  # LLAMA_ARGS is a list of flags
    run_sweep llama-server "$LLAMA_SERVER" -m "$MODEL" -t "$THREADS" --host 127.0.0.1 \
        --port "$PORT" $LLAMA_ARGS || rc=1
fi

# One line per benchmark: achieved req/s, TTFT median/p99, ITL and TPOT medians, output tok/s.
python3 - "$OUT" >"$OUT/summary.md" <<'EOF'
import json, os, sys
out = sys.argv[1]
print("| server | strategy | target r/s | req/s | TTFT mdn ms | TTFT p99 ms | ITL mdn ms | TPOT mdn ms | out tok/s | ok/err/inc |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name in ("troupe", "llama-server"):
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        continue
    for b in json.load(open(path))["benchmarks"]:
        s, m = b["config"]["strategy"], b["metrics"]
        ok = lambda k, st="median": m[k]["successful"][st]
        p99 = m["time_to_first_token_ms"]["successful"]["percentiles"]["p99"]
        n = m["request_totals"]
        rate = f"{s['rate']:.2f}" if s.get("rate") else "-"
        print(f"| {name} | {s['type_']} | {rate} | {ok('requests_per_second', 'mean'):.2f} "
              f"| {ok('time_to_first_token_ms'):.0f} | {p99:.0f} | {ok('inter_token_latency_ms'):.1f} "
              f"| {ok('time_per_output_token_ms'):.1f} | {ok('output_tokens_per_second', 'mean'):.1f} "
              f"| {n['successful']}/{n['errored']}/{n['incomplete']} |")
EOF
cat "$OUT/summary.md"
exit $rc
