#!/usr/bin/env python3
"""Pipelined instances in the cluster simulator with BanaServe's module
migration on and off (issue 35): 16 to 64 devices under a skewed load that
shifts from device to device.

Each instance's layers split over --stages devices of its own (SmolLM2's
cost model, 30 layers, the classifier about 8 layers' worth on the last
stage); a --loaded-share of the devices runs --load-skew times slower
(co-tenants), and which ones changes every --load-shift-s.  With
migration, every window the pipeline's own rule (plan_stage_rebalance, the
function the live pipeline calls) moves layers off the busiest stage
(--modes layers), a group of its KV heads to the least busy (heads), or
either (both), each move pausing the instance (--move-ms-per-layer for a
layer, --head-move-ms-per-layer for every head of a layer), and a group
away costing its donor --head-trip-ms per layer and micro-batch.

For each cluster size: the highest request rate at which 90% of requests
meet both SLOs (`troupe bench sim --sweep`) for each mode; then each mode at
80% of the off rate (latency and throughput at the same load).  Prints a
Markdown table.

  python3 bench/pipeline_sim.py [--instances 4 8 16] [--stages 4] \\
      [--modes off layers heads both] [--input-len 256] [--head-trip-ms 0.6]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TROUPE = os.path.join(REPO, "build", "troupe")


MODES = {"off": [], "layers": ["--layer-migration"], "heads": ["--head-migration"],
         "both": ["--layer-migration", "--head-migration"]}


def sim(args, n, mode, extra):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [TROUPE, "bench", "sim", "--cost-model", args.cost_model,
           "--instances", str(n), "--pipeline-stages", str(args.stages),
           "--load-skew", str(args.load_skew), "--load-shift-s", str(args.load_shift_s),
           "--move-ms-per-layer", str(args.move_ms_per_layer),
           "--head-move-ms-per-layer", str(args.head_move_ms_per_layer),
           "--head-trip-ms", str(args.head_trip_ms),
           "--num-requests", str(n * args.requests_per_instance),
           "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
           "--seed", "1", "--goodput", "ttft:%g" % args.ttft_ms, "tpot:%g" % args.tpot_ms,
           "--json-out", out] + MODES[mode] + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        j = json.load(f)
    os.unlink(out)
    return j


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cost-model", default=os.path.join(REPO, "bench/cost_models/smollm2_kv90.json"))
    p.add_argument("--instances", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--modes", nargs="+", default=["off", "layers"], choices=list(MODES))
    p.add_argument("--load-skew", type=float, default=3)
    p.add_argument("--load-shift-s", type=float, default=30)
    p.add_argument("--move-ms-per-layer", type=float, default=250)
    p.add_argument("--head-move-ms-per-layer", type=float, default=15)
    p.add_argument("--head-trip-ms", type=float, default=0.6)
    p.add_argument("--requests-per-instance", type=int, default=300)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--ttft-ms", type=float, default=3000)
    p.add_argument("--tpot-ms", type=float, default=150)
    p.add_argument("--sweep-steps", type=int, default=12)
    p.add_argument("--sweep-start", type=float, default=0.5, help="the sweep's first rate (req/s)")
    args = p.parse_args()
    if not os.path.exists(TROUPE):
        sys.exit("build troupe first (build/troupe)")
    modes = ["off"] + [m for m in args.modes if m != "off"]
    print("| devices | mode | highest rate (req/s) | vs off | at 80% of off's rate: TTFT p50, p99 (ms) | TPOT p50, p99 (ms) | output tok/s | layer moves (layers), head groups moved (home), pause |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.instances:
        sweep = ["--sweep", "--sweep-start", "%g" % args.sweep_start, "--sweep-steps", str(args.sweep_steps)]
        best = {m: sim(args, n, m, sweep)["sweep"]["highest_rate"] or 0.0 for m in modes}
        rate = 0.8 * best["off"] if best["off"] > 0 else 0.5
        for m in modes:
            r = sim(args, n, m, ["--request-rate", "%g" % rate])
            s = r["sim"]
            print("| %d | %s | %.2f | %.2fx | %.0f, %.0f | %.1f, %.1f | %.0f | %d (%d), %d (%d), %.1f s |" % (
                n * args.stages, m, best[m], best[m] / best["off"] if best["off"] else float("nan"),
                r["ttft_ms"]["median"], r["ttft_ms"]["p99"], r["tpot_ms"]["median"], r["tpot_ms"]["p99"],
                r["output_throughput"], s["layer_moves"], s["layers_moved"], s["head_moves"],
                s["heads_home"], s["move_pause_ms"] / 1000), flush=True)


if __name__ == "__main__":
    main()
