#!/usr/bin/env python3
"""SLO-ODBS against FIFO, length-only and SLO-only on a real instance
(issue 36 item 2): one `troupe serve` per configuration, the same seeded
workload sent to each over the ZeroMQ protocol, and a markdown table of
deadline misses, latency and throughput.

    build/py-venv/bin/python bench/slo_odbs_real.py [--rates 10] [--requests 200]
        [--batching static continuous] [--orders fifo length slo slo-odbs slo-odbs-fill]
        [--rounds 3]

slo-odbs-fill is slo-odbs with --odbs-fill: each group topped up to
--batch-max with later requests predicted no longer than its longest.

The workload is the simulator's (`troupe bench static-batch`) cut to
stories15M's 256-token context: four prompt classes, each named in the
request (`prompt_class`) and opening with its own words, whose outputs fill
one length bucket each ([8,16), [16,32), [64,128), [128,200) tokens; one
request in ten takes the next class's length), Poisson arrivals. Each
request's SLO is a completion deadline: a TTFT target uniform in
[--ttft-min-s, --ttft-max-s] plus --tpot-ms per output token, sent as
slo_ttft_ms / slo_tpot_ms; the server orders by the same formula with the
predicted length in place of the real one, and learns the lengths per
class from finished requests (no oracle). A deadline is missed when the
request's end-to-end latency passes TTFT target + TPOT target x its output
tokens. Before each configuration's timed run, a warm-up of --warmup
requests trains the predictor (the same for every configuration).

Needs the Python client (tools/python) and build/troupe; prints the table
and writes the raw figures as JSON (--out).
"""
import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from troupe_client import AsyncClient  # noqa: E402
from troupe_client.local_port import free_port  # noqa: E402

# (name, opening words, output tokens [lo, hi))
CLASSES = [
    ("greeting", "Say hello to the little dog.", (8, 16)),
    ("caption", "Write one line about the park.", (16, 32)),
    ("story", "Tell a story about a brave girl named Lily.", (64, 128)),
    ("saga", "Tell a long story about a dragon and a king.", (128, 200)),
]
WORDS = "sun tree ball cat happy big red jump play friend house boat rain".split()


def workload(n, rate, seed, ttft_range, tpot_ms):
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate)
        c = rng.randrange(len(CLASSES))
        name, words, (lo, hi) = CLASSES[c]
        if rng.random() < 0.1 and c + 1 < len(CLASSES):
            lo, hi = CLASSES[c + 1][2]  # one in ten: the next class's length
        prompt = words + " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16)))
        out.append({
            "at": t,
            "cls": name,
            "prompt": prompt,
            "max_tokens": rng.randrange(lo, hi),
            "ttft_ms": int(rng.uniform(*ttft_range) * 1000),
            "tpot_ms": tpot_ms,
        })
    return out


def metrics(http_port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5).read().decode()
    got = {}
    for name in ("troupe_length_predicted_total", "troupe_length_predicted_right_total",
                 "troupe_static_batches_total"):
        got[name] = sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return got


async def send_all(endpoint, reqs, timeout_s):
    async with AsyncClient(endpoint, timeout=timeout_s) as cl:
        t0 = time.monotonic()

        async def one(r):
            await asyncio.sleep(max(0.0, r["at"] - (time.monotonic() - t0)))
            sent = time.monotonic()
            res = await cl.generate(r["prompt"], stream=False, max_tokens=r["max_tokens"],
                                    ignore_eos=True, slo_ttft_ms=r["ttft_ms"],
                                    slo_tpot_ms=r["tpot_ms"], prompt_class=r["cls"])
            e2e = time.monotonic() - sent
            return {"e2e_s": e2e, "ttft_ms": res.ttft_ms, "tokens": res.completion_tokens,
                    "finish": res.finish_reason,
                    "deadline_s": (r["ttft_ms"] + r["tpot_ms"] * res.completion_tokens) / 1000}

        out = await asyncio.gather(*(one(r) for r in reqs))
        return out, time.monotonic() - t0


def run_config(args, batching, order, rate):
    port, http_port = free_port(), free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    # slo-odbs-fill: slo-odbs with its groups filled (--odbs-fill).
    fill = order == "slo-odbs-fill"
    cmd = [args.troupe, "serve", "-m", args.model, "--listen", endpoint, "--http-port",
           str(http_port), "--batching", batching, "--batch-order", "slo-odbs" if fill else order,
           "--batch-max", str(args.batch_max), "--max-seqs", str(args.max_seqs), "--odbs-threshold",
           str(args.odbs_threshold), "--odbs-fill", "true" if fill else "false"]
    log = open(os.path.join(args.log_dir, f"serve_{batching}_{order}_{rate}.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=2)
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server did not start: {' '.join(cmd)}")
                time.sleep(0.5)
        warm = workload(args.warmup, args.warmup_rate, args.seed + 1000, args.ttft_range, args.tpot_ms)
        asyncio.run(send_all(endpoint, warm, args.timeout))
        before = metrics(http_port)
        reqs = workload(args.requests, rate, args.seed, args.ttft_range, args.tpot_ms)
        res, wall = asyncio.run(send_all(endpoint, reqs, args.timeout))
        after = metrics(http_port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    done = [r for r in res if r["finish"] in ("length", "stop", "eos")]
    lat = sorted(r["e2e_s"] for r in done)
    missed = sum(1 for r in res if r["finish"] not in ("length", "stop", "eos") or r["e2e_s"] > r["deadline_s"])
    predicted = after["troupe_length_predicted_total"] - before["troupe_length_predicted_total"]
    right = after["troupe_length_predicted_right_total"] - before["troupe_length_predicted_right_total"]
    return {
        "batching": batching, "order": order, "rate": rate, "requests": len(res),
        "missed": missed / len(res),
        "mean_latency_s": sum(lat) / max(1, len(lat)),
        "p99_latency_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else 0.0,
        "mean_ttft_ms": sum(r["ttft_ms"] for r in done) / max(1, len(done)),
        "output_tok_s": sum(r["tokens"] for r in done) / wall,
        "bucket_accuracy": right / predicted if predicted else 0.0,
        "static_batches": after["troupe_static_batches_total"] - before["troupe_static_batches_total"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--troupe", default=os.path.join(ROOT, "build", "troupe"))
    ap.add_argument("--model", default="stories15m")
    ap.add_argument("--rates", type=float, nargs="+", default=[10.0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--warmup-rate", type=float, default=4.0)
    ap.add_argument("--batching", nargs="+", default=["static"], choices=["static", "continuous"])
    ap.add_argument("--orders", nargs="+", default=["fifo", "length", "slo", "slo-odbs", "slo-odbs-fill"],
                    choices=["deadline", "fifo", "length", "slo", "slo-odbs", "slo-odbs-fill"])
    ap.add_argument("--batch-max", type=int, default=8)
    ap.add_argument("--max-seqs", type=int, default=8)
    ap.add_argument("--odbs-threshold", type=float, default=1.0, help="slo-odbs: the grouping threshold")
    ap.add_argument("--ttft-min-s", type=float, default=0.2)
    ap.add_argument("--ttft-max-s", type=float, default=2.0)
    ap.add_argument("--tpot-ms", type=int, default=10)
    ap.add_argument("--seed", type=int, default=36)
    ap.add_argument("--rounds", type=int, default=1, help="rounds over every configuration (medians reported)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out", default="/tmp/slo_odbs_real.json")
    ap.add_argument("--log-dir", default="/tmp")
    args = ap.parse_args()
    args.ttft_range = (args.ttft_min_s, args.ttft_max_s)
    rows = []
    header = ("| batching | req/s | order | deadlines missed | mean latency s | p99 latency s | mean TTFT ms | "
              "output tok/s | bucket accuracy | static batches |\n|---|---|---|---|---|---|---|---|---|---|")

    def line(r):
        return (f"| {r['batching']} | {r['rate']:g} | {r['order']} | {100 * r['missed']:.1f}% | "
                f"{r['mean_latency_s']:.2f} | {r['p99_latency_s']:.2f} | {r['mean_ttft_ms']:.0f} | "
                f"{r['output_tok_s']:.1f} | {100 * r['bucket_accuracy']:.1f}% | {r['static_batches']:.0f} |")

    # Rounds alternate the orders so that each sees the same machine load;
    # the summary gives each figure's median over the rounds.
    print(header)
    for rnd in range(args.rounds):
        for batching in args.batching:
            for rate in args.rates:
                for order in args.orders:
                    r = run_config(args, batching, order, rate)
                    r["round"] = rnd
                    rows.append(r)
                    print(line(r), flush=True)
    if args.rounds > 1:
        print(f"\nmedians over {args.rounds} rounds:\n" + header)
        keys = ("missed", "mean_latency_s", "p99_latency_s", "mean_ttft_ms", "output_tok_s", "bucket_accuracy",
                "static_batches")
        for batching in args.batching:
            for rate in args.rates:
                for order in args.orders:
                    got = [r for r in rows if (r["batching"], r["rate"], r["order"]) == (batching, rate, order)]
                    med = {k: statistics.median(r[k] for r in got) for k in keys}
                    print(line({"batching": batching, "rate": rate, "order": order, **med}))
    with open(args.out, "w") as f:
        json.dump({"args": {k: v for k, v in vars(args).items()}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
