#!/usr/bin/env python3
"""A synthetic request trace whose prefill:decode demand shifts (issue 36
item 1), written in the Azure LLM inference trace format (TIMESTAMP,
ContextTokens, GeneratedTokens) so `troupe bench sim` and `troupe bench
serve` replay it with `--dataset-name azure --dataset-path FILE`.

Phases alternate: a burst phase of long prompts and short outputs (code
completion: prompts of --burst-prompt tokens, outputs of --burst-output, at
--burst-rate requests/s) and a steady phase of short prompts and long
outputs (conversation: --steady-prompt, --steady-output, --steady-rate).
Lengths vary +-25% around their means, arrivals are Poisson within each
phase, the seed fixes everything.

  python3 bench/phase_shift_trace.py --out phase.csv [--phases 6] \\
      [--burst-s 20] [--steady-s 40] [--burst-rate 8] [--steady-rate 2] \\
      [--burst-prompt 1500] [--burst-output 16] [--steady-prompt 100] \\
      [--steady-output 300] [--seed 36]
"""
import argparse
import datetime
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--phases", type=int, default=6, help="burst + steady pairs")
    ap.add_argument("--burst-s", type=float, default=20)
    ap.add_argument("--steady-s", type=float, default=40)
    ap.add_argument("--burst-rate", type=float, default=8)
    ap.add_argument("--steady-rate", type=float, default=2)
    ap.add_argument("--burst-prompt", type=int, default=1500)
    ap.add_argument("--burst-output", type=int, default=16)
    ap.add_argument("--steady-prompt", type=int, default=100)
    ap.add_argument("--steady-output", type=int, default=300)
    ap.add_argument("--seed", type=int, default=36)
    a = ap.parse_args()
    if min(a.phases, a.burst_s, a.steady_s, a.burst_rate, a.steady_rate) <= 0:
        ap.error("phases, durations and rates must be positive")

    rng = random.Random(a.seed)
    vary = lambda mean: max(1, round(mean * rng.uniform(0.75, 1.25)))  # noqa: E731
    start = datetime.datetime(2026, 1, 1)
    rows, t = [], 0.0
    for _ in range(a.phases):
        for length, rate, prompt, output in ((a.burst_s, a.burst_rate, a.burst_prompt, a.burst_output),
                                             (a.steady_s, a.steady_rate, a.steady_prompt,
                                              a.steady_output)):
            end = t + length
            t += rng.expovariate(rate)
            while t < end:
                rows.append((t, vary(prompt), vary(output)))
                t += rng.expovariate(rate)
            t = end
    with open(a.out, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for t, p, o in rows:
            stamp = (start + datetime.timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f")
            f.write(f"{stamp},{p},{o}\n")
    print(f"{a.out}: {len(rows)} requests over {t:.0f} s")


if __name__ == "__main__":
    main()
