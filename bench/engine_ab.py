#!/usr/bin/env python3
"""On/off comparisons of engine switches with `troupe bench engine`, in one run.

Each variant is a set of environment variables (the engine's switches:
TROUPE_GRAPH, TROUPE_INT8_DOT, ...); the pseudo-variable BIN names another
troupe binary (a build of another commit) for that variant.  Variants alternate round by round so
they see the same machine load (this machine is shared and noisy); the
table gives each variant's median over rounds and its ratio to the first.

  python3 bench/engine_ab.py --variant "graph on:TROUPE_GRAPH=1" \\
      --variant "graph off:TROUPE_GRAPH=0" [--models smollm2-135m-instruct,stories15m] \\
      [--rounds 5] [--reps 3] [-p 0] [-n 128]
"""
import argparse
import os
import statistics
import sys

from engine_vs_llamacpp import troupe_bench


def parse_variant(text):
    name, _, assigns = text.partition(":")
    env = {}
    for a in filter(None, assigns.split(",")):
        k, _, v = a.partition("=")
        env[k.strip()] = v.strip()
    return name.strip(), env


def bench(troupe, model, env, reps, n_prompt, n_gen):
    env = dict(env)
    troupe = env.pop("BIN", troupe)
    return troupe_bench(troupe, model, reps, n_prompt, n_gen, {**os.environ, **env})


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", required=True,
                    help="NAME:VAR=VALUE[,VAR=VALUE...] (the first is the baseline)")
    ap.add_argument("--models", default="smollm2-135m-instruct,stories15m")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-p", "--n-prompt", type=int, default=0)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("--troupe",
                    default=os.path.join(os.path.dirname(__file__), "..", "build", "troupe"))
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    samples = {}  # (model, test, variant) -> [t/s]
    for model in args.models.split(","):
        for rnd in range(args.rounds):
            print(f"[{model}] round {rnd + 1}/{args.rounds}", file=sys.stderr, flush=True)
            for name, env in variants:
                res = bench(args.troupe, model, env, args.reps, args.n_prompt, args.n_gen)
                for test, tps in res.items():
                    samples.setdefault((model, test, name), []).append(tps)
    print("| model | test | " + " | ".join(f"{n} t/s" for n, _ in variants) + " | " +
          " | ".join(f"{n} / {variants[0][0]}" for n, _ in variants[1:]) + " |")
    print("|---" * (2 + 2 * len(variants) - 1) + "|")
    keys = sorted({(m, t) for m, t, _ in samples})
    for model, test in keys:
        med = [statistics.median(samples[(model, test, n)]) for n, _ in variants]
        print(f"| {model} | {test} | " + " | ".join(f"{m:.1f}" for m in med) + " | " +
              " | ".join(f"{m / med[0]:.2f}" for m in med[1:]) + " |")


if __name__ == "__main__":
    main()
