#!/usr/bin/env python3
"""BanaServe's load-aware dispatch (router policy load-aware, issue 35 item
4) against prefix-aware placement and least-load on a shared-prefix
workload, live.

For each policy, in rounds (policies interleaved, so the machine's noise
falls on all of them alike), starts `troupe serve` with two local
instances of one core each and a host KV tier, drives it with `troupe bench
serve --dataset-name shared-prefix` (a few groups of requests sharing a
long prefix, Poisson arrivals), and stops it.  Reports per policy the
request throughput, TTFT p50/p99, end-to-end latency p50 and the share of
prompt tokens the server found cached (median over rounds).

  python3 bench/load_aware_dispatch.py [--model smollm2-135m-instruct] \\
      [--rounds 2] [--requests 32] [--rate 0.7] [--groups 4] \\
      [--prefix-len 256] [--suffix-len 32] [--output-len 32]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from kv_tiers import REPO, Server  # same folder: the server start and stop

POLICIES = ["prefix", "load-aware", "least-load"]


def bench(troupe, server, a, out):
    cmd = [troupe, "bench", "serve", "--server", server.endpoint, "--dataset-name", "shared-prefix",
           "--prefix-repetition-num-prefixes", str(a.groups),
           "--prefix-repetition-prefix-len", str(a.prefix_len),
           "--prefix-repetition-suffix-len", str(a.suffix_len),
           "--prefix-repetition-output-len", str(a.output_len),
           "--num-requests", str(a.requests), "--request-rate", str(a.rate), "--seed", str(a.seed),
           "--no-progress", "--json-out", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"load_aware_dispatch: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    with open(out) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--troupe", default=os.path.join(REPO, "build", "troupe"))
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rate", type=float, default=0.7)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--prefix-len", type=int, default=256)
    ap.add_argument("--suffix-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--kv-host-mb", type=int, default=64)
    ap.add_argument("--seed", type=int, default=35)
    a = ap.parse_args()

    rows = {p: [] for p in POLICIES}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(a.rounds):
            for p in POLICIES:
                server = Server(a.troupe, a.model,
                                ["--local-instances", "2", "--instance-cores", "1", "--router", p,
                                 "--kv-host-mb", str(a.kv_host_mb), "--admin-port", "-1"])
                try:
                    j = bench(a.troupe, server, a, os.path.join(tmp, f"{p}-{rnd}.json"))
                finally:
                    server.stop()
                rows[p].append(j)
                print(f"round {rnd + 1} {p}: {j['request_throughput']:.3f} req/s, TTFT p50 "
                      f"{j['ttft_ms']['median']:.0f} ms, cached {100 * j['cached_share']:.0f}%",
                      file=sys.stderr)

    med = lambda xs: statistics.median(xs)  # noqa: E731
    print("| policy | req/s | TTFT p50 ms | TTFT p99 ms | E2EL p50 ms | prompt tokens cached |")
    print("|---|---|---|---|---|---|")
    for p in POLICIES:
        js = rows[p]
        print(f"| {p} | {med([j['request_throughput'] for j in js]):.3f} | "
              f"{med([j['ttft_ms']['median'] for j in js]):.0f} | "
              f"{med([j['ttft_ms']['p99'] for j in js]):.0f} | "
              f"{med([j['e2el_ms']['median'] for j in js]):.0f} | "
              f"{100 * med([j['cached_share'] for j in js]):.0f}% |")


if __name__ == "__main__":
    main()
