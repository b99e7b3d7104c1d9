#!/usr/bin/env python3
"""troupe vs llama.cpp, llama-bench style (pp512 / tg128), in the same run.

Alternates the two systems round by round so both see the same machine
load, and prints a markdown table with throughputs and ratios.

  LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin python3 bench/engine_vs_llamacpp.py \
      [--rounds 3] [--reps 3] [--threads 2] [--troupe build/troupe] [--baseline OLD/troupe]

Each round also measures the machine's read bandwidth (`troupe bench
bandwidth`) and F32 arithmetic peak (`troupe bench compute`): after each
model's rows, the single-stream decode roofline the bandwidth sets
(bandwidth over the weight bytes a token reads) and both systems' tg as a
share of it, and the prefill roofline the peak sets (peak over the
operations a prompt token costs) and both systems' pp as a share of it,
for models whose layers hold float weights (quantized ones multiply in
integers, which the F32 peak does not bound).

--baseline adds a second troupe binary (an earlier build: a refactor's
"before") to every round, and its column and ratio: new / before.

Models: SmolLM2-135M-Instruct Q4_1 (both systems read the same GGUF),
stories15M (troupe reads the llama2.c checkpoint; llama.cpp needs the F32
GGUF made from it, see docs/peer_llamacpp.md: STORIES_GGUF) and Gemma 3
270M Q4_K_M where `bash tools/setup.sh gemma3` fetched it; or, with
--gguf PATH (repeatable), those files only, both systems reading each.
This script never builds llama.cpp.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run_json(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"engine_vs_llamacpp: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def llama_bench(bin_dir, model, threads, reps, n_prompt, n_gen):
    out = run_json([os.path.join(bin_dir, "llama-bench"), "-m", model, "-t", str(threads),
                    "-p", str(n_prompt), "-n", str(n_gen), "-r", str(reps), "-o", "json"])
    res = {}
    for row in out:
        test = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
        res[test] = row["avg_ts"]
    return res


def troupe_bench(troupe, model, reps, n_prompt, n_gen, env=None):
    out = run_json([troupe, "bench", "engine", "-m", model, "-p", str(n_prompt), "-n", str(n_gen),
                    "-r", str(reps), "--json"], env)
    return {r["test"]: r["tokens_per_s"] for r in out["results"]}


def roofline(troupe, model, threads):
    return run_json([troupe, "bench", "bandwidth", "--json", "-m", model, "-t", str(threads)])


def compute_roofline(troupe, model, threads, n_prompt):
    return run_json([troupe, "bench", "compute", "--json", "-m", model, "-t", str(threads),
                     "-p", str(n_prompt)])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--troupe", default=os.path.join(os.path.dirname(__file__), "..", "build", "troupe"))
    ap.add_argument("--baseline", help="an earlier troupe binary, measured in the same rounds")
    ap.add_argument("--gguf", action="append", default=[],
                    help="bench this GGUF file instead of the default models (repeatable)")
    args = ap.parse_args()
    bin_dir = os.environ.get("LLAMA_CPP_BIN")
    if not bin_dir or not os.path.isfile(os.path.join(bin_dir, "llama-bench")):
        sys.exit("engine_vs_llamacpp: set LLAMA_CPP_BIN to the folder of an existing llama.cpp build "
                 "(holding llama-bench); this script never builds llama.cpp")
    model_dir = os.environ.get("TROUPE_MODEL_DIR", os.path.expanduser("~/.cache/troupe/models"))
    models = [("SmolLM2-135M-Instruct Q4_1", "smollm2-135m-instruct",
               os.path.join(model_dir, "SmolLM2-135M-Instruct.Q4_1.gguf"))]
    stories = os.environ.get("STORIES_GGUF", os.path.join(model_dir, "stories15M-f32.gguf"))
    if os.path.isfile(stories):
        models.append(("stories15M F32", "stories15m", stories))
    else:
        print(f"note: {stories} missing, stories15M skipped (see docs/peer_llamacpp.md)", file=sys.stderr)
    gemma = os.path.join(model_dir, "gemma-3-270m-q4_k_m.gguf")
    if os.path.isfile(gemma):
        models.append(("Gemma 3 270M Q4_K_M", "gemma3-270m", gemma))
    if args.gguf:
        models = [(os.path.basename(g), os.path.abspath(g), os.path.abspath(g)) for g in args.gguf]

    # --n-prompt 0 or --n-gen 0 leaves that test out.
    tests = [t for t, n in ((f"pp{args.n_prompt}", args.n_prompt), (f"tg{args.n_gen}", args.n_gen)) if n > 0]
    if args.baseline:
        print("| model | test | llama.cpp t/s | troupe t/s | troupe / llama.cpp | before t/s | troupe / before |")
        print("|---|---|---|---|---|---|---|")
    else:
        print("| model | test | llama.cpp t/s | troupe t/s | troupe / llama.cpp |")
        print("|---|---|---|---|---|")
    notes = []
    for label, troupe_name, gguf in models:
        peer, ours, before = ({t: [] for t in tests} for _ in range(3))
        bounds, peaks = [], []
        # One untimed troupe run first: PoCL compiles each kernel variant on
        # its first launch (then caches it on disk), which llama.cpp, built
        # ahead of time, never pays inside a round.
        print(f"[{label}] warm-up (troupe, not recorded)", file=sys.stderr)
        troupe_bench(args.troupe, troupe_name, 1, args.n_prompt, args.n_gen)
        if args.baseline:
            troupe_bench(args.baseline, troupe_name, 1, args.n_prompt, args.n_gen)
        for rnd in range(args.rounds):
            print(f"[{label}] round {rnd + 1}/{args.rounds}", file=sys.stderr)
            for t, v in llama_bench(bin_dir, gguf, args.threads, args.reps, args.n_prompt, args.n_gen).items():
                peer[t].append(v)
            for t, v in troupe_bench(args.troupe, troupe_name, args.reps, args.n_prompt, args.n_gen).items():
                ours[t].append(v)
            bounds.append(roofline(args.troupe, troupe_name, args.threads))
            if args.n_prompt > 0:
                peaks.append(compute_roofline(args.troupe, troupe_name, args.threads, args.n_prompt))
            if args.baseline:
                for t, v in troupe_bench(args.baseline, troupe_name, args.reps, args.n_prompt, args.n_gen).items():
                    before[t].append(v)
        for t in tests:
            p, o = statistics.median(peer[t]), statistics.median(ours[t])
            row = f"| {label} | {t} | {p:.1f} | {o:.1f} | {o / p:.2f} |"
            if args.baseline:
                b = statistics.median(before[t])
                row += f" {b:.1f} | {o / b:.2f} |"
            print(row)
        tg = f"tg{args.n_gen}"
        if args.n_gen > 0 and bounds:
            gbs = statistics.median(b["read_gb_s"] for b in bounds)
            bound = statistics.median(b["decode_roofline_tok_s"] for b in bounds)
            notes.append(f"{label}: {bounds[0]['decode_weight_mb']:.1f} MB of weights a token, read "
                  f"bandwidth {gbs:.1f} GB/s ({args.threads} threads): decode roofline {bound:.0f} t/s; "
                  f"{tg} troupe {statistics.median(ours[tg]) / bound:.0%}, "
                  f"llama.cpp {statistics.median(peer[tg]) / bound:.0%} of it")
        pp = f"pp{args.n_prompt}"
        if args.n_prompt > 0 and peaks and peaks[0].get("float_weights"):
            gflops = statistics.median(p["f32_gflop_s"] for p in peaks)
            bound = statistics.median(p["prefill_roofline_tok_s"] for p in peaks)
            notes.append(f"{label}: {peaks[0]['prefill_mflop_per_token']:.2f} MFLOP a prompt token, F32 "
                  f"peak {gflops:.0f} GFLOP/s ({args.threads} threads, {peaks[0]['isa']}): prefill "
                  f"roofline {bound:.0f} t/s; {pp} troupe {statistics.median(ours[pp]) / bound:.0%}, "
                  f"llama.cpp {statistics.median(peer[pp]) / bound:.0%} of it")
        sys.stdout.flush()
    print()
    for n in notes:
        print(n)


if __name__ == "__main__":
    main()
