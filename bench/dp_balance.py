#!/usr/bin/env python3
"""A data-parallel group of two replicas under a skewed load (issue 15,
item 4): KV-token imbalance and the lockstep rounds' straggler wait with the
group's rebalancing off and on, the same seeded workload in both runs.
Not in CI (about a minute).

  build/py-venv/bin/python bench/dp_balance.py [--troupe build/troupe]
      [--model moe-8x2-skew] [--waves 8] [--wave-s 0.5] [--per-wave 6]
      [--instance-cores 1] [--report docs/bench_dp.md]

The load comes in waves: a long prompt (about 190 tokens) that wants 2
tokens, then --per-wave short prompts (seeded picks) that want 200 tokens
each, all at once.  Admission by most free KV counts the long prompt's KV
until it is computed, so the short ones pile onto the other replica, and
when the long prompt leaves its replica is nearly empty: the skew the
group's rebalancing (the gap between the replicas' KV tokens above 20% of
the mean, two checks in a row) corrects by moving sequences.  An MoE group
steps in lockstep, so every round waits for the replica with the most
work: that wait is what balance saves.  Each replica runs on its own core
(--instance-cores 1), as replicas on devices of their own would.

Every request's tokens must be the same in both runs (greedy), or the
script fails: a move may not change a request.
"""
import argparse
import asyncio
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools", "python"))
from cluster_bench import Child, free_port  # noqa: E402
from troupe_client import AsyncClient  # noqa: E402

SHORT = ["Once upon a time", "The little dog ran", "Lily and her mom", "A boy found a ball",
         "The sun was hot", "Tom had a red car", "She liked to sing", "The cat sat on"]
LONG = "the little dog ran to the park and " * 17


def workload(waves, wave_s, per_wave, seed):
    rng = random.Random(seed)
    out = []
    for w in range(waves):
        out.append((w * wave_s, LONG, 2))
        out += [(w * wave_s + 0.001, rng.choice(SHORT), 200) for _ in range(per_wave)]
    return out


def admin(troupe, port, cmd):
    r = subprocess.run([troupe, "client", "-s", f"tcp://127.0.0.1:{port}", "--json", "admin", cmd],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        sys.exit(f"dp_balance: admin {cmd}: {r.stderr}")
    return json.loads(r.stdout)


async def drive(endpoint, load):
    start = time.monotonic()
    async with AsyncClient(endpoint, timeout=300) as cl:
        async def one(i, at, prompt, n):
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            return i, await cl.generate(prompt, stream=False, max_tokens=n, ignore_eos=True,
                                        request_id=i + 1)
        res = await asyncio.gather(*(one(i, *w) for i, w in enumerate(load)))
    return dict(res), time.monotonic() - start


def run(args, rebalance, load):
    port = free_port()
    serve = Child([args.troupe, "serve", "-m", args.model, "--listen", f"tcp://127.0.0.1:{port}",
                   "--local-instances", "2", "--dp-group", "--dp-interval-ms", "20",
                   "--dp-rebalance", "true" if rebalance else "false", "--kv-mb", "16",
                   "--instance-cores", str(args.instance_cores)],
                  "troupe serve: listening on ")
    try:
        results, wall = asyncio.run(drive(f"tcp://127.0.0.1:{port}", load))
        dp = admin(args.troupe, port, "dp")
    finally:
        serve.stop()
    for i, r in results.items():
        if r.error or r.finish_reason != "length":
            sys.exit(f"dp_balance: request {i + 1}: {r.finish_reason} {r.error}")
    out_tokens = sum(r.completion_tokens for r in results.values())
    tpot = [r.tpot_ms for r in results.values() if r.completion_tokens > 1]
    rounds = max(dp["rounds"], 1)
    return {
        "rebalance": rebalance,
        "wall_s": wall,
        "tokens_per_s": out_tokens / wall,
        "tpot_ms_mean": statistics.mean(tpot),
        "tpot_ms_p90": statistics.quantiles(tpot, n=10)[-1],
        "mean_gap_over_mean": dp["mean_gap_over_mean"],
        "max_gap_tokens": dp["max_gap_tokens"],
        "rounds": dp["rounds"],
        "round_ms_mean": dp["round_ms"] / rounds,
        "straggler_ms_per_round": dp["straggler_ms"] / rounds,
        "wait_ms": [r["wait_ms"] for r in dp["replicas"]],
        "step_ms": [r["step_ms"] for r in dp["replicas"]],
        "dummy_steps": [r["dummy_steps"] for r in dp["replicas"]],
        "admitted": [r["admitted"] for r in dp["replicas"]],
        "migrations": dp["migrations"],
        "failed_migrations": dp["failed_migrations"],
        "migrated_tokens": dp["migrated_tokens"],
        "tokens": {i: r.token_ids for i, r in results.items()},
    }


def report(args, runs):
    off, on = runs
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                         capture_output=True, text=True).stdout.strip()
    lines = [
        "# Data-parallel group under a skewed load",
        "",
        f"Generated by `bench/dp_balance.py` on {datetime.date.today()}, {cpu}, "
        f"{os.cpu_count()} cores; model {args.model}; {args.waves} waves {args.wave_s} s apart, "
        f"each a long prompt and {args.per_wave} decoding requests (seed {args.seed}); two "
        "replicas in one `troupe serve` (`--dp-group`, lockstep on as for an MoE model, checks "
        f"every 20 ms, threshold 20% of the mean), each on its own {args.instance_cores} core(s).",
        "",
        "Command: `build/py-venv/bin/python bench/dp_balance.py "
        f"--waves {args.waves} --wave-s {args.wave_s} --per-wave {args.per_wave} "
        f"--instance-cores {args.instance_cores} --seed {args.seed}`",
        "",
        "| figure | rebalancing off | rebalancing on |",
        "|---|---|---|",
    ]

    def row(name, key, fmt="{:.2f}"):
        f = (lambda v: " / ".join(fmt.format(x) for x in v)) if isinstance(off[key], list) \
            else (lambda v: fmt.format(v))
        lines.append(f"| {name} | {f(off[key])} | {f(on[key])} |")

    row("KV-token gap over the mean, averaged over checks", "mean_gap_over_mean")
    row("largest KV-token gap (tokens)", "max_gap_tokens", "{}")
    row("lockstep rounds", "rounds", "{}")
    row("mean round (ms, the slowest replica's step)", "round_ms_mean")
    row("slowest step minus mean step, per round (ms)", "straggler_ms_per_round", "{:.3f}")
    row("time each replica waited for the slowest (ms)", "wait_ms", "{:.0f}")
    row("time each replica stepped (ms)", "step_ms", "{:.0f}")
    row("dummy steps per replica", "dummy_steps", "{}")
    row("requests admitted per replica", "admitted", "{}")
    row("sequences moved (failed)", "migrations", "{}")
    lines[-1] = lines[-1].replace(f"| {on['migrations']} |",
                                  f"| {on['migrations']} ({on['failed_migrations']}) |")
    row("KV tokens moved", "migrated_tokens", "{}")
    row("wall time (s)", "wall_s")
    row("output tokens per second", "tokens_per_s", "{:.1f}")
    row("TPOT mean (ms)", "tpot_ms_mean")
    row("TPOT p90 (ms)", "tpot_ms_p90")
    lines += ["", f"Every request's {sum(len(t) for t in off['tokens'].values())} tokens were "
              "the same in both runs.", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--troupe", default=os.path.join(REPO, "build", "troupe"))
    ap.add_argument("--model", default="moe-8x2-skew")
    ap.add_argument("--waves", type=int, default=8)
    ap.add_argument("--wave-s", type=float, default=0.5)
    ap.add_argument("--per-wave", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--instance-cores", type=int, default=1,
                    help="each replica on its own slice of this many cores (0: shared)")
    ap.add_argument("--report", default="")
    args = ap.parse_args()
    load = workload(args.waves, args.wave_s, args.per_wave, args.seed)
    runs = []
    for rebalance in (False, True):
        print(f"dp_balance: rebalancing {'on' if rebalance else 'off'} ...", file=sys.stderr)
        runs.append(run(args, rebalance, load))
    if runs[0]["tokens"] != runs[1]["tokens"]:
        bad = [i + 1 for i in runs[0]["tokens"] if runs[0]["tokens"][i] != runs[1]["tokens"][i]]
        sys.exit(f"dp_balance: requests {bad} changed when moved")
    text = report(args, runs)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
