#!/usr/bin/env python3
"""Issue 36's dynamic-PD comparison in the simulator (not in CI: many
minutes of simulation).  For each instance count and workload, the highest
request rate at which 90% of requests meet both SLOs, per configuration:

  mixed       undisaggregated instances, least-load placement
  pd-minimal  static PD (half prefill), minimal-load placement
  pd-dynamic  PD with SLO-aware placement and role switching through mixed
              instances (the default, --flip-via-mixed true)
  pd-report   the same with the report's straight P<->D flips, one a window
  pd-dynamic-drain, pd-report-drain
              the same two without D->P preemption by migration
              (--flip-migrate false: streams finish where they are)

Workloads: `phase` (bench/phase_shift_trace.py: bursts of long prompts and
short outputs alternating with short prompts and long outputs; its rates
scaled by a factor, the highest factor found by bisection), `bursty`
(random sizes, gamma arrivals, burstiness 0.1) and `steady` (Poisson), the
last two by `bench sim --sweep`.  Every run uses a router that sees the
instances through 100 ms old snapshots, as the real one does.

  python3 bench/pd_dynamic_bench.py [--troupe build/troupe] [--instances 16,32,64]
      [--workloads phase,bursty,steady] [--configs mixed,pd-minimal,pd-dynamic,pd-report]
      [--json-out FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from service_bench import random_slos  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
COST = os.path.join(REPO, "bench", "cost_models", "stories15m.json")

CONFIGS = {
    "mixed": ["--router", "least-load"],
    "pd-minimal": ["--pd", "--pd-placement", "least-load"],
    "pd-dynamic": ["--pd", "--pd-placement", "slo", "--role-switching"],
    "pd-dynamic-nounmix": ["--pd", "--pd-placement", "slo", "--role-switching", "--flip-unmix", "false"],
    "pd-dynamic-mixed": ["--pd", "--pd-placement", "slo", "--role-switching"],
    "pd-report": ["--pd", "--pd-placement", "slo", "--role-switching", "--flip-via-mixed",
                  "false", "--flip-max", "1"],
    # Without D->P preemption by migration: a flip off decode leaves the
    # instance's streams to finish there (as before issue 36's migration).
    "pd-dynamic-drain": ["--pd", "--pd-placement", "slo", "--role-switching",
                         "--flip-migrate", "false"],
    "pd-report-drain": ["--pd", "--pd-placement", "slo", "--role-switching", "--flip-via-mixed",
                        "false", "--flip-max", "1", "--flip-migrate", "false"],
}


def sim(troupe, flags):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = subprocess.run([troupe, "bench", "sim", "--cost-model", COST, "--json-out", f.name,
                            "--router-staleness-ms", "100", *flags],
                           capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            sys.exit(f"pd_dynamic_bench: exit {r.returncode}: {r.stderr[-2000:]}")
        return json.load(open(f.name))


def phase_probe(a, n, scale, extra):
    """Goodput share and stats of the phase trace at `scale` times its
    rates, on n instances (rates also grow with n / 16)."""
    k = scale * n / 16
    with tempfile.NamedTemporaryFile(suffix=".csv") as t:
        subprocess.run([sys.executable, os.path.join(REPO, "bench", "phase_shift_trace.py"),
                        "--out", t.name, "--burst-rate", str(8 * k), "--steady-rate",
                        str(2 * k), "--burst-prompt", str(a.burst_prompt)], check=True, capture_output=True)
        rows = sum(1 for _ in open(t.name)) - 1
        j = sim(a.troupe, ["--instances", str(n), "--dataset-name", "azure", "--dataset-path",
                           t.name, "--num-requests", str(rows), "--goodput", "ttft:1500",
                           "tpot:60", "--ttft-target-ms", "1500", "--tpot-target-ms", "60",
                           *extra])
    share = j["good_completed"] / max(1, j["num_requests"])
    return share, j


def phase_highest(a, n, extra):
    lo, hi = 0.0, None
    scale, best = 0.5, None
    for _ in range(a.probes):
        share, j = phase_probe(a, n, scale, extra)
        print(f"    scale {scale:.3f}: {share:.3f} good, {j['sim']['flips']} flips", flush=True)
        if share >= 0.9:
            lo, best = scale, j
            scale = scale * 2 if hi is None else (lo + hi) / 2
        else:
            hi = scale
            scale = (lo + hi) / 2
    rate = lo * n / 16 * (8 * 20 + 2 * 40) / 60  # the trace's mean rate at that scale
    return rate, best


def sweep_highest(a, n, burstiness, extra):
    j = sim(a.troupe, ["--instances", str(n), "--dataset-name", "random", "--random-input-len",
                       "96", "--random-output-len", "48", "--random-range-ratio", "0.5",
                       "--num-requests", str(300 * n), "--burstiness", str(burstiness), "--seed",
                       "5", "--goodput", f"ttft:{a.ttft:.1f}", f"tpot:{a.tpot:.1f}",
                       "--ttft-target-ms", f"{a.ttft:.1f}", "--tpot-target-ms", f"{a.tpot:.1f}",
                       "--sweep", "--goodput-target", "0.9", "--sweep-start", str(n),
                       "--sweep-steps", str(a.probes + 4), "--sweep-precision", "0.02", *extra])
    best = j["sweep"]["highest_rate"]
    at = [p for p in j["probes"] if p.get("request_rate") == best]
    return best, (at[0] if at else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--troupe", default=os.path.join(REPO, "build", "troupe"))
    ap.add_argument("--instances", default="16,32,64")
    ap.add_argument("--workloads", default="phase,bursty,steady")
    ap.add_argument("--configs", default="mixed,pd-minimal,pd-dynamic,pd-report")
    ap.add_argument("--probes", type=int, default=8, help="bisection steps per phase search")
    ap.add_argument("--burst-prompt", type=int, default=800,
                    help="the phase trace's burst prompts (at 1500, the longest ones alone "
                    "take longer than the 1.5 s TTFT target with this cost model)")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    # The random workloads' SLOs, as service_bench.py's part sim sets them.
    a.ttft, a.tpot = random_slos(json.load(open(COST))["step_ms"])
    out = []
    for n in [int(x) for x in a.instances.split(",")]:
        for w in a.workloads.split(","):
            for c in a.configs.split(","):
                extra = CONFIGS[c] + (["--min-decode", "2"] if c.startswith("pd") else [])
                if c == "pd-dynamic-mixed":  # starting all mixed
                    extra += ["--roles", ",".join(["mixed"] * n)]
                print(f"{n} instances, {w}, {c}", flush=True)
                if w == "phase":
                    rate, j = phase_highest(a, n, extra)
                else:
                    rate, j = sweep_highest(a, n, 0.1 if w == "bursty" else 1.0, extra)
                s = (j or {}).get("sim", {})
                row = {"instances": n, "workload": w, "config": c, "highest_rate": rate,
                       "flips": s.get("flips", 0), "evacuated": s.get("evacuated", 0),
                       "ttft_mape": s.get("ttft_prediction_mape"),
                       "ttft_p99_ms": (j or {}).get("ttft_ms", {}).get("p99")}
                print(f"  -> {rate:.2f} req/s, {row['flips']} flips", flush=True)
                out.append(row)
                if a.json_out:
                    json.dump(out, open(a.json_out, "w"), indent=1)


if __name__ == "__main__":
    main()
