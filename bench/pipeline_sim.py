#!/usr/bin/env python3
"""Pipelined instances in the cluster simulator with BanaServe's layer
migration on and off (issue 35): 16 to 64 devices under a skewed load that
shifts from device to device.

Each instance's layers split over --stages devices of its own (SmolLM2's
cost model, 30 layers, the classifier about 8 layers' worth on the last
stage); a --loaded-share of the devices runs --load-skew times slower
(co-tenants), and which ones changes every --load-shift-s.  With
migration, every window the pipeline's own rule (plan_layer_move, the
function the live pipeline calls) moves layers off the busiest stage,
each layer moved pausing the instance --move-ms-per-layer.

For each cluster size: the highest request rate at which 90% of requests
meet both SLOs (`troupe bench sim --sweep`), off and on; then both at 80%
of the off rate (latency and throughput at the same load).  Prints a
Markdown table.

  python3 bench/pipeline_sim.py [--instances 4 8 16] [--stages 4] \\
      [--load-skew 3] [--load-shift-s 30] [--move-ms-per-layer 250]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TROUPE = os.path.join(REPO, "build", "troupe")


def sim(args, n, migration, extra):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [TROUPE, "bench", "sim", "--cost-model", args.cost_model,
           "--instances", str(n), "--pipeline-stages", str(args.stages),
           "--load-skew", str(args.load_skew), "--load-shift-s", str(args.load_shift_s),
           "--move-ms-per-layer", str(args.move_ms_per_layer),
           "--num-requests", str(n * args.requests_per_instance),
           "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
           "--seed", "1", "--goodput", "ttft:%g" % args.ttft_ms, "tpot:%g" % args.tpot_ms,
           "--json-out", out] + extra
    if migration:
        cmd.append("--layer-migration")
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
    p.add_argument("--load-skew", type=float, default=3)
    p.add_argument("--load-shift-s", type=float, default=30)
    p.add_argument("--move-ms-per-layer", type=float, default=250)
    p.add_argument("--requests-per-instance", type=int, default=300)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--ttft-ms", type=float, default=3000)
    p.add_argument("--tpot-ms", type=float, default=150)
    p.add_argument("--sweep-steps", type=int, default=12)
    args = p.parse_args()
    if not os.path.exists(TROUPE):
        sys.exit("build troupe first (build/troupe)")
    print("| devices | highest rate off / on (req/s) | on / off | at 80% of off: TTFT p50, p99 off / on (ms) | TPOT p50, p99 off / on (ms) | output tok/s off / on | moves (layers), pause on |")
    print("|---|---|---|---|---|---|---|")
    for n in args.instances:
        sweep = ["--sweep", "--sweep-start", "0.5", "--sweep-steps", str(args.sweep_steps)]
        best = {}
        for mig in (False, True):
            r = sim(args, n, mig, sweep)["sweep"]["highest_rate"]
            best[mig] = r or 0.0
        rate = 0.8 * best[False] if best[False] > 0 else 0.5
        at = {mig: sim(args, n, mig, ["--request-rate", "%g" % rate]) for mig in (False, True)}
        off, on = at[False], at[True]
        s = on["sim"]
        print("| %d | %.2f / %.2f | %.2fx | %.0f, %.0f / %.0f, %.0f | %.1f, %.1f / %.1f, %.1f | %.0f / %.0f | %d (%d), %.1f s |" % (
            n * args.stages, best[False], best[True],
            best[True] / best[False] if best[False] else float("nan"),
            off["ttft_ms"]["median"], off["ttft_ms"]["p99"], on["ttft_ms"]["median"], on["ttft_ms"]["p99"],
            off["tpot_ms"]["median"], off["tpot_ms"]["p99"], on["tpot_ms"]["median"], on["tpot_ms"]["p99"],
            off["output_throughput"], on["output_throughput"],
            s["layer_moves"], s["layers_moved"], s["move_pause_ms"] / 1000), flush=True)


if __name__ == "__main__":
    main()
