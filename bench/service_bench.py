#!/usr/bin/env python3
"""The service-layer benchmarks of issue 11 (not in CI: minutes of load on a
quiet machine).  Real processes on 127.0.0.1 and `troupe bench sim`.

  python3 bench/service_bench.py [--troupe build/troupe] [--parts calibrate,real,sim,pd,colocation]
      [--report docs/bench_service.md] [--model stories15m]

calibrate   `troupe bench sim-calibrate` with one PoCL thread (one core per
            instance, as the real runs below give each instance), written to
            bench/cost_models/MODEL.json.
real        simulator against reality: two `troupe node`s with one PoCL
            thread and one instance each behind one `troupe serve`
            (least-load), and `troupe bench sim --instances 2` with the
            cost model, under the same seeded workloads; TTFT and TPOT
            medians and throughput side by side.
sim         the xLLM report's comparison (Fig. 21) in the simulator at 16
            and 32 instances: SLO-aware dynamic PD (placement by predicted
            TTFT, decode under caps, role switching) against static PD with
            minimal-load and round-robin placement, on a bursty (gamma,
            burstiness 0.1, CV about 3) and a steady (Poisson) arrival
            process: the highest rate at which 90% of requests meet both
            SLOs (bench sim --sweep).
pd          real disaggregation on two instances (prefill, decode): the KV
            handoff's bytes and time per request from the traces, and a
            role flip's latency (admin role: message to the instance's
            answer) beside starting an instance with its model.
colocation  online load with TTFT/TPOT targets plus a rising offline load on
            two real instances: co-location (offline yields and is
            preempted), online priority without preemption, and static
            disaggregation; the highest offline throughput with at most 5%
            of online requests missing a target, and the preemption count.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_bench import Child, free_port  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"service_bench: {' '.join(args)}: exit {r.returncode}: {r.stderr[-2000:]}")
    return r


# stories15M's context is 256 tokens: prompts 48-144, outputs 24-72.
def load_flags(rate, n, seed, input_len=96, output_len=48, burstiness=1.0, extra=()):
    return ["--dataset-name", "random", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--random-range-ratio", "0.5",
            "--num-requests", str(n), "--request-rate", str(rate), "--burstiness",
            str(burstiness), "--seed", str(seed), *extra]


def summary(j):
    return {"ttft_p50": j["ttft_ms"]["median"], "tpot_p50": j["tpot_ms"]["median"],
            "ttft_p99": j["ttft_ms"]["p99"], "tpot_p99": j["tpot_ms"]["p99"],
            "req_s": j["request_throughput"], "tok_s": j["output_throughput"],
            "completed": j["completed"], "failed": j["failed"]}


class Service:
    """`troupe serve` over `nodes` troupe nodes (one PoCL thread each), or
    with local instances when nodes is 0."""

    def __init__(self, troupe, model, nodes=0, local=1, args=(), threads=1):
        self.troupe, self.nodes, self.secret = troupe, [], None
        extra = []
        if nodes:
            self.secret = tempfile.NamedTemporaryFile("w", delete=False)
            self.secret.write("service-bench-secret-0123456789abcdef\n")
            self.secret.close()
            os.chmod(self.secret.name, 0o600)
            addrs = []
            for _ in range(nodes):
                port = free_port()
                self.nodes.append(Child([troupe, "node", "--listen", f"127.0.0.1:{port}",
                                         "--cluster-secret-file", self.secret.name],
                                        "troupe node: listening on",
                                        {"POCL_MAX_PTHREAD_COUNT": str(threads)}))
                addrs.append(f"127.0.0.1:{port}")
            extra = ["--nodes", ",".join(addrs), "--cluster-secret-file", self.secret.name,
                     "--local-instances", "0"]
        else:
            extra = ["--local-instances", str(local)]
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        env = {} if nodes else {"POCL_MAX_PTHREAD_COUNT": str(max(threads, local))}
        self.serve = Child([troupe, "serve", "-m", model, "--listen", self.endpoint, *extra,
                            *args], "troupe serve: listening on", env)

    def bench(self, flags, out):
        run([self.troupe, "bench", "serve", "--server", self.endpoint, "--ignore-eos",
             "--no-progress", "--json-out", out, *flags], timeout=1800)
        with open(out) as f:
            return json.load(f)

    def admin(self, *args):
        r = run([self.troupe, "client", "--server", self.endpoint, "admin", *args, "--json"],
                timeout=120)
        return json.loads(r.stdout)

    def close(self):
        self.serve.stop()
        for n in self.nodes:
            n.stop()
        if self.secret:
            os.unlink(self.secret.name)


def part_calibrate(a, out):
    os.makedirs(os.path.dirname(a.cost_model), exist_ok=True)
    t0 = time.monotonic()
    r = run([a.troupe, "bench", "sim-calibrate", "-m", a.model, "-o", a.cost_model],
            env={**os.environ, "POCL_MAX_PTHREAD_COUNT": "1"}, timeout=1800)
    out["calibrate"] = {"line": r.stdout.strip(), "seconds": time.monotonic() - t0}
    print(r.stdout.strip())


def sim(a, flags, extra=(), cost_model=None):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        run([a.troupe, "bench", "sim", "--cost-model", cost_model or a.cost_model, *extra,
             "--json-out",
             f.name, *flags], timeout=3600)
        return json.load(open(f.name))


def calibrate_live(troupe, model, base, out, loads=((4, 99), (10, 98))):
    """The step costs as a two-node deployment sees them (the nodes, the
    service and the client sharing the cores): calibration loads of random
    requests at each (rate, seed), the service's steps refitted into the
    cost model `base`, written to `out`; returns sim-calibrate's line."""
    svc = Service(troupe, model, nodes=2, args=["--step-history", "100000"])
    try:
        for rate, seed in loads:
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                svc.bench(load_flags(rate, 150, seed=seed), f.name)
        r = run([troupe, "bench", "sim-calibrate", "-m", model, "--server", svc.endpoint,
                 "--base", base, "-o", out], timeout=300)
        return r.stdout.strip()
    finally:
        svc.close()


def random_slos(cm):
    """SLOs of the random workloads [ours]: TTFT = 3 x the prefill time of
    the p95 prompt (140 tokens: 96 +- 50%), TPOT = 3 x a lone decode step
    (REFERENCES.md section 1, reduced scale).  cm: a cost model's step_ms."""
    p95 = 140
    ttft = 3 * (cm["c0"] + cm["c_prefill"] * p95 + cm["c_context"] * p95 * p95 / 2)
    tpot = 3 * (cm.get("c_one") or cm["c0"] + cm["c_decode"])
    return ttft, tpot


def part_real(a, out):
    # The step costs as this deployment sees them: a separate calibration
    # load (seeds 99 and 98, two rates) on the same setup.
    live = a.cost_model.replace(".json", "_2nodes.json")
    out["calibrate_live"] = calibrate_live(a.troupe, a.model, a.cost_model, live)
    print(out["calibrate_live"])
    rows = []
    for rate in (3, 6, 9):
        flags = load_flags(rate, 240, seed=11)
        svc = Service(a.troupe, a.model, nodes=2)
        try:
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                real = summary(svc.bench(flags, f.name))
        finally:
            svc.close()
        simulated = summary(sim(a, flags, ["--instances", "2", "--router", "least-load"],
                                cost_model=live))
        rows.append({"rate": rate, "real": real, "sim": simulated})
        print(f"rate {rate}: real {real} sim {simulated}")
    out["real"] = rows


def part_sim(a, out):
    ttft, tpot = random_slos(json.load(open(a.cost_model))["step_ms"])
    res = {"slo": {"ttft_ms": ttft, "tpot_ms": tpot}, "runs": []}
    for n in (16, 32):
        for trace, burst in (("bursty", 0.1), ("steady", 1.0)):
            for name, extra in (("slo-dynamic", ["--pd-placement", "slo", "--role-switching"]),
                                ("minimal-load", ["--pd-placement", "least-load"]),
                                ("round-robin", ["--pd-placement", "round-robin"])):
                flags = ["--dataset-name", "random", "--random-input-len", "96",
                         "--random-output-len", "48", "--random-range-ratio", "0.5",
                         "--num-requests", str(300 * n), "--burstiness", str(burst),
                         "--seed", "5", "--goodput", f"ttft:{ttft:.1f}", f"tpot:{tpot:.1f}",
                         "--sweep", "--goodput-target", "0.9", "--sweep-start", str(n),
                         "--sweep-steps", "14", "--sweep-precision", "0.02"]
                j = sim(a, flags, ["--instances", str(n), "--pd", "--ttft-target-ms",
                                   f"{ttft:.1f}", "--tpot-target-ms", f"{tpot:.1f}",
                                   "--min-decode", "2", *extra])
                best = j["sweep"]["highest_rate"]
                flips = max((p["sim"]["flips"] for p in j["probes"]), default=0)
                res["runs"].append({"instances": n, "trace": trace, "policy": name,
                                    "highest_rate": best, "max_flips": flips})
                print(f"{n} instances, {trace}, {name}: {best} req/s ({flips} flips at most)")
    out["sim"] = res


def trace_of(svc, rid):
    return svc.admin("trace", str(rid))


def part_pd(a, out):
    svc = Service(a.troupe, a.model, local=2, args=["--pd", "--roles", "prefill,decode"],
                  threads=2)
    res = {}
    try:
        # One request at a time, prompts of 32..512 tokens: the handoff alone.
        sys.path.insert(0, os.path.join(REPO, "tools", "python"))
        from troupe_client import Client
        c = Client(svc.endpoint)
        hand = []
        for i, n in enumerate((16, 32, 64, 128, 200)):  # stories15M: 256 tokens of context
            for rep in range(3):
                rid = 1000 + i * 10 + rep
                ids = [300 + ((j * 7 + rep) % 20000) for j in range(n)]
                c.generate(ids, stream=False, max_tokens=16, ignore_eos=True, request_id=rid)
                t = trace_of(svc, rid)
                hand.append({"prompt": n, "bytes": t["transfer_bytes"], "ms": t["transfer_ms"],
                             "ttft_ms": t["ttft_ms"], "prefill": t["prefill_instance"],
                             "decode": t["decode_instance"]})
        res["handoffs"] = hand
        # Role flips by message under load.
        flips = []
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            import threading
            th = threading.Thread(target=svc.bench, args=(load_flags(4, 60, seed=2), f.name))
            th.start()
            for role in ("prefill", "decode", "prefill", "decode"):
                time.sleep(1.5)
                t0 = time.monotonic()
                svc.admin("role", "2", role)
                flips.append((time.monotonic() - t0) * 1000)
            th.join()
            b = json.load(open(f.name))
        res["flip_cli_ms"] = flips
        res["flip_load"] = {"completed": b["completed"], "failed": b["failed"]}
        log = svc.serve.stderr()
        res["flip_router_ms"] = [float(x) for x in re.findall(r"pool \S+ -> \S+, ([0-9.]+) ms", log)]
    finally:
        svc.close()
    # Restarting an instance: a fresh serve with its model, to listening.
    starts = []
    for _ in range(3):
        t0 = time.monotonic()
        s = Service(a.troupe, a.model, local=1)
        starts.append((time.monotonic() - t0) * 1000)
        s.close()
    res["restart_ms"] = starts
    out["pd"] = res
    print(json.dumps(res, indent=1)[:3000])


def class_stats(j, ttft, tpot):
    online = [r for r in j["requests"] if not r["offline"]]
    offline = [r for r in j["requests"] if r["offline"]]
    def tp(r):
        return (r["e2el"] - r["ttft"]) / max(1, r["output_tokens"] - 1) * 1000
    miss = sum(1 for r in online if not r["success"] or r["ttft"] * 1000 > ttft or tp(r) > tpot)
    off_tok = sum(r["output_tokens"] for r in offline if r["success"])
    ttfts = sorted(r["ttft"] * 1000 for r in online if r["success"]) or [0]
    return {"online": len(online), "online_miss": miss / max(1, len(online)),
            "online_ttft_p50": ttfts[len(ttfts) // 2], "online_ttft_p99": ttfts[int(len(ttfts) * 0.99)],
            "offline_tok_s": off_tok / j["duration_s"], "offline_done": sum(1 for r in offline if r["success"])}


def part_colocation(a, out):
    ttft, tpot = 400.0, 40.0
    policies = (("colocation", ["--colocate"]),
                ("online-priority", []),
                ("static-pd", ["--pd", "--roles", "prefill,decode"]))
    res = out.get("colocation", {"slo": {"ttft_ms": ttft, "tpot_ms": tpot}, "runs": []})
    # Preemption latency: the time online arrivals wait in the queue under
    # each policy is in the online TTFT; the preemptions are counted.
    # Online: a steady 3 req/s; offline: a rising share of the same stream.
    for name, args in policies:
        if a.policies and name not in a.policies.split(","):
            continue
        for frac in [float(x) for x in a.fractions.split(",")]:
            total = 3 / (1 - frac) if frac < 1 else 3
            svc = Service(a.troupe, a.model, local=2, threads=2,
                          args=["--ttft-target-ms", str(ttft), "--tpot-target-ms", str(tpot),
                                *args])
            try:
                with tempfile.NamedTemporaryFile(suffix=".json") as f:
                    j = svc.bench(load_flags(round(total, 3), int(30 * total), seed=9,
                                             extra=["--offline-fraction", str(frac)]), f.name)
                inst = svc.admin("instances")
            finally:
                svc.close()
            s = class_stats(j, ttft, tpot)
            s.update({"policy": name, "offline_fraction": frac, "rate": total,
                      "preemptions": sum(i.get("preempted_recompute", 0) + i.get("preempted_swap", 0)
                                         for i in inst)})
            res["runs"] = [r for r in res["runs"]
                           if (r["policy"], r["offline_fraction"]) != (name, frac)] + [s]
            print(s)
    out["colocation"] = res


def write_report(a, out):
    lines = [f"# Service-layer benchmarks (issue 11)\n",
             "Made by `build/py-venv/bin/python bench/service_bench.py --parts PART` (the parts "
             "calibrate, real, sim, pd and colocation, each run on its own; the report is "
             f"rewritten from all kept figures), last on {datetime.date.today()}, model "
             f"{a.model}, this machine ({os.cpu_count()} cores, PoCL, shared and noisy: single "
             "runs, no repetitions).  Raw figures: "
             f"`{os.path.relpath(a.json_out, REPO)}`.\n"]
    if "calibrate" in out:
        lines += ["## Cost model\n", "Measured in one process, one PoCL thread "
                  "(`troupe bench sim-calibrate`):\n", "```", out["calibrate"]["line"], "```\n"]
    if "calibrate_live" in out:
        lines += ["Refitted from the steps of the two-node service under a calibration load "
                  "(`sim-calibrate --server`, used for the comparison with reality):\n", "```",
                  out["calibrate_live"], "```\n"]
    if "real" in out:
        lines += ["## Simulator against reality\n",
                  "Two real instances (two `troupe node`s, one PoCL thread each, least-load) and "
                  "`troupe bench sim --instances 2` on the same seeded workload: 240 random "
                  "requests, prompts 48-144 tokens, 24-72 output tokens, Poisson arrivals.\n",
                  "| rate | TTFT p50 real / sim | TPOT p50 real / sim | req/s real / sim | "
                  "worst gap |", "|---|---|---|---|---|"]
        for r in out["real"]:
            R, S = r["real"], r["sim"]
            gaps = [abs(S[k] - R[k]) / R[k] for k in ("ttft_p50", "tpot_p50", "req_s") if R[k]]
            lines.append(f"| {r['rate']} | {R['ttft_p50']:.1f} / {S['ttft_p50']:.1f} ms | "
                         f"{R['tpot_p50']:.2f} / {S['tpot_p50']:.2f} ms | "
                         f"{R['req_s']:.2f} / {S['req_s']:.2f} | {max(gaps) * 100:.0f}% |")
        lines.append("")
    if "sim" in out:
        s = out["sim"]
        lines += ["## The report's comparison in the simulator\n",
                  f"SLOs: TTFT {s['slo']['ttft_ms']:.0f} ms, TPOT {s['slo']['tpot_ms']:.1f} ms "
                  "(3 x the p95 prompt's prefill, 3 x a batch-1 step); the highest rate at which "
                  "90% of requests meet both.\n",
                  "| instances | trace | SLO-aware dynamic PD | minimal load | round robin | "
                  "dynamic / minimal | minimal / RR |", "|---|---|---|---|---|---|---|"]
        by = {(r["instances"], r["trace"], r["policy"]): r["highest_rate"] or 0 for r in s["runs"]}
        for n in (16, 32):
            for t in ("bursty", "steady"):
                d, m, rr = by.get((n, t, "slo-dynamic"), 0), by.get((n, t, "minimal-load"), 0), \
                    by.get((n, t, "round-robin"), 0)
                lines.append(f"| {n} | {t} | {d:.1f} | {m:.1f} | {rr:.1f} | "
                             f"{d / m if m else 0:.2f}x | {m / rr if rr else 0:.2f}x |")
        lines += [
            "| xLLM report (Fig. 21) | Azure Code (bursty) | | | | 1.67x | up to +4.3% "
            "attainment |",
            "| xLLM report (Fig. 21) | Azure Conversation (steady) | | | | 1.1x | up to +2.4% "
            "attainment |", "",
            "Settings: stories15M cost model (one PoCL thread per instance), random prompts "
            "48-144 tokens and 24-72 output tokens, 300 requests per instance per probe, "
            "gamma arrivals (burstiness 0.1 for the bursty trace, 1 for Poisson), PD with half "
            "the instances prefill at the start, `--min-decode 2`, window 1 s, 2 windows of "
            "hysteresis, 2 s cooldown, flip_miss_share 0.1; the baselines keep the starting "
            "pools and place prefill on the least queued prefill tokens (minimal load) or in "
            "turn, and decode on the fewest running tokens or in turn.", "",
            "Why ours differ from the report's:",
            "- **One flip per window.** The policy moves one instance per second. A "
            "gamma burst (CV about 3) rises and falls within a few seconds, so at 16-32 "
            "instances the pools adapt after the burst has passed.  The report does not "
            "say how fast its flips go.",
            "- **Loose SLOs against a short service time.** Three times a step leaves room, "
            "so the static half/half split is already close to the right prefill:decode ratio "
            "for this workload (prefill about 40 ms, decode about 48 steps of a few ms each, "
            "batched), and there is little for re-balancing to win.",
            "- **An ideal router for the baselines.** The simulated router sees each instance's "
            "exact state (no polling delay), which makes minimal load and even round robin "
            "very good at spreading a burst. The real router polls every 100 ms.",
            "- **Synthetic traces and a tiny model.** The Azure traces are not available here. "
            "The report's model, hardware and SLO values are not given.",
            "- **Flips before the fix.** The literal trigger (flip whenever any prefill is "
            "predicted to miss) thrashed: 97 flips in a probe, and a quarter of the baselines' "
            "rate. The TTFT predictor was fitted on decode steps too and was off by 86%. Both "
            "are fixed (flip_miss_share; prefill-only fit, 13% error), and the table is after "
            "the fix.", ""]
    if "pd" in out:
        p = out["pd"]
        lines += ["## Disaggregation on two real instances\n",
                  "| prompt | KV bytes | handoff ms (median) |", "|---|---|---|"]
        by = {}
        for h in p["handoffs"]:
            by.setdefault(h["prompt"], []).append(h)
        for n, hs in sorted(by.items()):
            lines.append(f"| {n} | {hs[0]['bytes']} | {statistics.median(h['ms'] for h in hs):.1f} |")
        rt = p.get("flip_router_ms", [])
        lines += ["",
                  f"Role flip (admin role under load): router message to the instance's answer "
                  f"{', '.join(f'{x:.2f}' for x in rt)} ms; the CLI round trip "
                  f"{', '.join(f'{x:.0f}' for x in p['flip_cli_ms'])} ms.  Restarting an "
                  f"instance with its model (a fresh serve to listening): "
                  f"{', '.join(f'{x:.0f}' for x in p['restart_ms'])} ms.  The load during the "
                  f"flips: {p['flip_load']['completed']} completed, {p['flip_load']['failed']} "
                  "failed.\n"]
    if "colocation" in out:
        c = out["colocation"]
        lines += ["## Online/offline co-location on two real instances\n",
                  f"Online 3 req/s with TTFT {c['slo']['ttft_ms']:.0f} ms and TPOT "
                  f"{c['slo']['tpot_ms']:.0f} ms targets; offline requests added as a rising "
                  "share of the stream.\n",
                  "| policy | offline share | offline tok/s | online missing a target | "
                  "online TTFT p50 / p99 ms | preemptions |", "|---|---|---|---|---|---|"]
        for r in sorted(c["runs"], key=lambda r: (r["policy"], r["offline_fraction"])):
            lines.append(f"| {r['policy']} | {r['offline_fraction']} | {r['offline_tok_s']:.1f} | "
                         f"{r['online_miss'] * 100:.1f}% | {r.get('online_ttft_p50', 0):.0f} / "
                         f"{r.get('online_ttft_p99', 0):.0f} | {r['preemptions']} |")
        best = {}
        for r in c["runs"]:
            if r["online_miss"] <= 0.05:
                best[r["policy"]] = max(best.get(r["policy"], 0), r["offline_tok_s"])
        lines += ["", "Highest offline throughput with at most 5% of online requests missing: " +
                  ", ".join(f"{k} {v:.1f} tok/s" for k, v in best.items()) + ".",
                  "The policies: colocation = `--colocate` (offline rows take what online rows "
                  "leave, the TPOT guard caps them, online arrivals preempt offline work, EDF); "
                  "online-priority = no flag (online admitted first, running offline work keeps "
                  "its rows); static-pd = `--pd --roles prefill,decode` with both classes placed "
                  "alike.  Preemptions stayed 0: at these loads an online arrival always found a "
                  "sequence slot and pages, so the offline work yielded rows (skipped steps, "
                  "paused prefill chunks) rather than being preempted; a yield takes effect at "
                  "the next step boundary (one step, 5-60 ms here).  An earlier run before the "
                  "TPOT guard existed had online-priority missing 83% at share 0.75 and "
                  "colocation 54%: the machine is noisy, the ranking held.\n"]
    with open(a.report, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--troupe", default=os.path.join(REPO, "build", "troupe"))
    ap.add_argument("--model", default="stories15m")
    ap.add_argument("--parts", default="calibrate,real,sim,pd,colocation")
    ap.add_argument("--report", default=os.path.join(REPO, "docs", "bench_service.md"))
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--fractions", default="0,0.5,0.6,0.65,0.7,0.75",
                    help="colocation: offline shares of the stream (runs are kept and replaced)")
    ap.add_argument("--policies", default="", help="colocation: only these policies")
    a = ap.parse_args()
    a.cost_model = os.path.join(REPO, "bench", "cost_models", f"{a.model}.json")
    a.json_out = a.json_out or os.path.join(REPO, "bench", "cost_models",
                                            f"service_bench_{a.model}.json")
    out = {}
    if os.path.exists(a.json_out):
        out = json.load(open(a.json_out))
    for part in filter(None, a.parts.split(",")):
        {"calibrate": part_calibrate, "real": part_real, "sim": part_sim, "pd": part_pd,
         "colocation": part_colocation}[part](a, out)
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)
    write_report(a, out)


if __name__ == "__main__":
    main()
