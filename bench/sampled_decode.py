#!/usr/bin/env python3
"""Sampled decode against greedy decode, troupe alone (issue 38's target:
temperature 0.8, top-p 0.95, seeded, within 5% of greedy).

Alternates `troupe bench engine -p 0 -n N` greedy and sampled, round by
round, so both see the same machine load, and prints a markdown table of
mean tokens per second and sampled / greedy per model and sampling.

  python3 bench/sampled_decode.py [--troupe build/troupe] [--rounds 3] [--reps 3] [-n 128]
      [-m smollm2-135m-instruct -m gemma3-270m] [--only "T 1" ...]
"""
import argparse
import json
import statistics
import subprocess
import sys

SAMPLINGS = {
    "T 0.8, top-p 0.95": ["--temperature", "0.8", "--top-p", "0.95"],
    "T 1": ["--temperature", "1"],
    "T 0.8, top-k 40": ["--temperature", "0.8", "--top-k", "40"],
    "T 0.8, top-k 40, top-p 0.95, min-p 0.05": [
        "--temperature", "0.8", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05"],
    "T 0.8, top-p 0.95, penalties": [
        "--temperature", "0.8", "--top-p", "0.95", "--repetition-penalty", "1.1",
        "--presence-penalty", "0.5", "--frequency-penalty", "0.3"],
    "greedy, penalties": ["--repetition-penalty", "1.1", "--presence-penalty", "0.5",
                          "--frequency-penalty", "0.3"],
}


def tg(troupe, model, n, reps, extra):
    cmd = [troupe, "bench", "engine", "-m", model, "-p", "0", "-n", str(n), "-r", str(reps),
           "--json"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sampled_decode: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)["results"][0]["tokens_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--troupe", default="build/troupe")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-m", "--model", action="append")
    ap.add_argument("--only", action="append", help="only these samplings (names as printed)")
    a = ap.parse_args()
    models = a.model or ["smollm2-135m-instruct"]
    runs = {}
    for rnd in range(a.rounds):
        for m in models:
            runs.setdefault((m, "greedy"), []).append(tg(a.troupe, m, a.n, a.reps, []))
            for name, extra in SAMPLINGS.items():
                if a.only and name not in a.only:
                    continue
                runs.setdefault((m, name), []).append(tg(a.troupe, m, a.n, a.reps, extra))
        print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr)
    print(f"| model | sampling | tg{a.n} t/s | / greedy |")
    print("|---|---|---|---|")
    for m in models:
        g = statistics.mean(runs[(m, "greedy")])
        print(f"| {m} | greedy | {g:.1f} | 1.00 |")
        for name in SAMPLINGS:
            if (m, name) not in runs:
                continue
            s = statistics.mean(runs[(m, name)])
            print(f"| {m} | {name} | {s:.1f} | {s / g:.2f} |")


if __name__ == "__main__":
    main()
