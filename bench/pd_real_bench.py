#!/usr/bin/env python3
"""Issue 36 item 1's dynamic-PD comparison on two real instances, beside the
simulator on the same trace (not in CI: about fifteen minutes of load).

Two `troupe node`s (one PoCL thread each, as the simulator gives each
instance one step at a time) behind one `troupe serve`, stories15M, and
`troupe bench sim --instances 2` with a cost model refitted from this
deployment's own steps.  The workload is bench/phase_shift_trace.py at
reduced scale (stories15M has 256 tokens of context): bursts of long prompts
and short outputs alternating with short prompts and long outputs, its rates
multiplied by each --scales entry.  Per configuration and scale: the share of
requests meeting both SLOs, TTFT and TPOT medians, and the role flips, real
beside simulated.

  mixed       undisaggregated, least-load
  pd-minimal  static PD: one prefill and one decode instance (with one of
              each, minimal-load and SLO-aware placement are the same)
  pd-dynamic  PD with role switching through mixed instances (all start
              mixed), as `troupe serve --pd --role-switching` runs it

  python3 bench/pd_real_bench.py [--troupe build/troupe] [--scales 0.5,1,1.5]
      [--configs mixed,pd-minimal,pd-dynamic] [--json-out FILE] [--no-calibrate]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from service_bench import Service, calibrate_live, run  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# The same configuration, as the service and as the simulator spell it.
CONFIGS = {
    "mixed": (["--router", "least-load"], ["--router", "least-load"]),
    "pd-minimal": (["--pd", "--roles", "prefill,decode"],
                   ["--pd", "--pd-placement", "least-load", "--roles", "prefill,decode"]),
    "pd-dynamic": (["--pd", "--role-switching"],
                   ["--pd", "--pd-placement", "slo", "--role-switching"]),
}


def make_trace(path, a, scale):
    subprocess.run([sys.executable, os.path.join(REPO, "bench", "phase_shift_trace.py"),
                    "--out", path, "--phases", str(a.phases), "--burst-s", "10", "--steady-s",
                    "20", "--burst-rate", str(a.burst_rate * scale), "--steady-rate",
                    str(a.steady_rate * scale), "--burst-prompt", "180", "--burst-output", "16",
                    "--steady-prompt", "40", "--steady-output", "160", "--seed", "36"],
                   check=True, capture_output=True)
    return sum(1 for _ in open(path)) - 1


def stats(j, flips):
    return {"good_share": j["good_completed"] / max(1, j["num_requests"]),
            "ttft_p50": j["ttft_ms"]["median"], "ttft_p90": j["ttft_ms"]["p90"],
            "tpot_p50": j["tpot_ms"]["median"], "tpot_p90": j["tpot_ms"]["p90"],
            "completed": j["completed"], "failed": j.get("failed", 0), "flips": flips}


def slo_flags(a):
    return ["--ttft-target-ms", str(a.ttft), "--tpot-target-ms", str(a.tpot)]


def calibrate(a):
    """The step costs as this deployment sees them, refitted into the base
    cost model; random loads at three rates, so that decode batches of one
    to a few dozen rows are all seen."""
    print(calibrate_live(a.troupe, "stories15m", a.base_cost_model, a.cost_model,
                         loads=((4, 99), (10, 98), (20, 97))), flush=True)


def real(a, config, trace, rows):
    svc = Service(a.troupe, "stories15m", nodes=2, args=[*CONFIGS[config][0], *slo_flags(a)])
    try:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            j = svc.bench(["--dataset-name", "azure", "--dataset-path", trace, "--num-requests",
                           str(rows), "--goodput", f"ttft:{a.ttft}", f"tpot:{a.tpot}"], f.name)
        flips = len(re.findall(r"router: instance \d+ role", svc.serve.stderr()))
    finally:
        svc.close()
    return stats(j, flips)


def simulated(a, config, trace, rows):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        run([a.troupe, "bench", "sim", "--cost-model", a.cost_model, "--instances", "2",
             "--router-staleness-ms", "100", *CONFIGS[config][1], *slo_flags(a),
             "--dataset-name", "azure", "--dataset-path", trace, "--num-requests", str(rows),
             "--goodput", f"ttft:{a.ttft}", f"tpot:{a.tpot}", "--json-out", f.name], timeout=600)
        j = json.load(open(f.name))
    return stats(j, j["sim"]["flips"])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--troupe", default=os.path.join(REPO, "build", "troupe"))
    ap.add_argument("--scales", default="0.5,1,1.5", help="multiples of the trace's rates")
    ap.add_argument("--configs", default="mixed,pd-minimal,pd-dynamic")
    ap.add_argument("--burst-rate", type=float, default=8, help="burst requests/s at scale 1")
    ap.add_argument("--steady-rate", type=float, default=4, help="steady requests/s at scale 1")
    ap.add_argument("--phases", type=int, default=2, help="burst + steady pairs of 10 + 20 s")
    ap.add_argument("--ttft", type=float, default=1000, help="TTFT target, ms")
    ap.add_argument("--tpot", type=float, default=40, help="TPOT target, ms")
    ap.add_argument("--base-cost-model",
                    default=os.path.join(REPO, "bench", "cost_models", "stories15m.json"))
    ap.add_argument("--cost-model", default="/tmp/pd_real_2nodes.json",
                    help="the refitted cost model (written unless --no-calibrate)")
    ap.add_argument("--no-calibrate", action="store_true",
                    help="use --cost-model as it is (no calibration load first)")
    ap.add_argument("--sim-only", action="store_true", help="skip the real runs")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    if not a.no_calibrate:
        calibrate(a)
    out = {"ttft_ms": a.ttft, "tpot_ms": a.tpot, "runs": []}
    for scale in [float(x) for x in a.scales.split(",")]:
        with tempfile.NamedTemporaryFile(suffix=".csv") as t:
            rows = make_trace(t.name, a, scale)
            for c in a.configs.split(","):
                row = {"scale": scale, "config": c, "requests": rows,
                       "sim": simulated(a, c, t.name, rows)}
                if not a.sim_only:
                    row["real"] = real(a, c, t.name, rows)
                print(json.dumps(row), flush=True)
                out["runs"].append(row)
                if a.json_out:
                    json.dump(out, open(a.json_out, "w"), indent=1)


if __name__ == "__main__":
    main()
