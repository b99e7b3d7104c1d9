#!/bin/bash
# (bench/serve_http_vs_zmq.sh MODEL; writes /tmp/bh_*.json; not in CI.)
# troupe bench serve through the ZeroMQ protocol and through the OpenAI HTTP API, same server, same load.
B=${TROUPE_BIN:-$(dirname "$0")/../build/troupe}
MODEL=$1
$B serve -m $MODEL --listen tcp://127.0.0.1:47300 --http-port 47380 > /tmp/bh.out 2>/tmp/bh.err & SV=$!
for i in $(seq 1 100); do grep -q "http on" /tmp/bh.out && break; sleep 0.2; done
COMMON="--num-requests 64 --max-concurrency 8 --random-input-len 128 --random-output-len 64 --ignore-eos --seed 1 --num-warmups 2 --no-progress"
for rep in 1 2; do
  $B bench serve --backend troupe --server tcp://127.0.0.1:47300 $COMMON --json-out /tmp/bh_zmq_${rep}.json > /dev/null 2>&1
  $B bench serve --backend openai --base-url http://127.0.0.1:47380 --model $MODEL $COMMON --json-out /tmp/bh_http_${rep}.json > /dev/null 2>&1
  python3 - "$MODEL" $rep <<'PY'
import json, sys
m, rep = sys.argv[1], sys.argv[2]
for kind in ("zmq", "http"):
    d = json.load(open(f"/tmp/bh_{kind}_{rep}.json"))
    print(m, rep, kind, d["completed"], d["failed"], round(d["output_throughput"], 1), round(d["ttft_ms"]["median"], 1), round(d["tpot_ms"]["median"], 2), round(d["itl_ms"]["median"], 2))
PY
done
kill $SV; wait $SV 2>/dev/null
