#!/usr/bin/env python3
"""Step overlap on and off, through the instance actor, in one run.

`troupe bench batch --step-overlap true|false` (N greedy requests enqueued
at once, EOS ignored) alternated round by round, so both see the same
machine load.  Per model and N: the decode-phase generation rate (after the
last sequence got its first token), the mean step time, and the device's
idle time between steps (what overlap hides), medians over rounds.

  python3 bench/step_overlap_ab.py [--models smollm2-135m-instruct,stories15m] \\
      [--requests 1,8] [--rounds 5] [--prompt-len 32] [--gen-len 200] \\
      [--troupe-arg=--flash-attention=true ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def bench(troupe, model, n, prompt_len, gen_len, overlap, extra):
    cmd = [troupe, "bench", "batch", "-m", model, "--requests", str(n), "--prompt-len",
           str(prompt_len), "--gen-len", str(gen_len), "--json",
           f"--step-overlap={'true' if overlap else 'false'}"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"step_overlap_ab: {' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m-instruct,stories15m")
    ap.add_argument("--requests", default="1,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen-len", type=int, default=200)  # stories15m: 256 of context
    ap.add_argument("--troupe-arg", action="append", default=[])
    ap.add_argument("--troupe",
                    default=os.path.join(os.path.dirname(__file__), "..", "build", "troupe"))
    args = ap.parse_args()
    rows = []
    for model in args.models.split(","):
        for n in [int(x) for x in args.requests.split(",")]:
            got = {True: [], False: []}
            for rnd in range(args.rounds):
                print(f"[{model} x{n}] round {rnd + 1}/{args.rounds}", file=sys.stderr, flush=True)
                for overlap in (False, True):
                    got[overlap].append(bench(args.troupe, model, n, args.prompt_len,
                                              args.gen_len, overlap, args.troupe_arg))
            med = {o: {k: statistics.median(r[k] for r in got[o])
                       for k in ("decode_phase_tokens_per_s", "mean_step_ms",
                                 "device_idle_ms_per_step")} for o in got}
            overlapped = statistics.median(r["overlapped_steps"] / max(r["steps"], 1)
                                           for r in got[True])
            rows.append((model, n, med[False], med[True], overlapped))
    print("| model | sequences | off t/s | on t/s | on / off | off step ms | on step ms "
          "| off idle ms/step | on idle ms/step | steps sent ahead |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model, n, off, on, share in rows:
        print(f"| {model} | {n} | {off['decode_phase_tokens_per_s']:.1f} | "
              f"{on['decode_phase_tokens_per_s']:.1f} | "
              f"**{on['decode_phase_tokens_per_s'] / off['decode_phase_tokens_per_s']:.3f}** | "
              f"{off['mean_step_ms']:.2f} | {on['mean_step_ms']:.2f} | "
              f"{off['device_idle_ms_per_step']:.3f} | {on['device_idle_ms_per_step']:.3f} | "
              f"{share:.0%} |")


if __name__ == "__main__":
    main()
