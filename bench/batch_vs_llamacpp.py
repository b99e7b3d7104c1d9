#!/usr/bin/env python3
"""troupe vs llama.cpp, offline throughput with many requests in flight.

llama.cpp: llama-batched-bench -npp P -ntg G -npl N (N parallel sequences
in one KV cache, all prompts prefilled, then N tokens per decode step).
troupe: `troupe bench batch` (N requests enqueued at once to one instance,
continuous batching, greedy, EOS ignored).  The two run alternately, round
by round, so both see the same machine load; the script prints a markdown
table of medians over rounds with troupe / llama.cpp ratios.

  LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin \\
  STORIES_GGUF=/path/to/stories15M-f32.gguf \\
      python3 bench/batch_vs_llamacpp.py [--rounds 2] [--parallel 64] \\
          [--prompt-len 128] [--gen-len 128] [--threads 2] [--troupe build/troupe] \\
          [--models smollm2,stories15m] [--troupe-arg=--max-batch-tokens=512 ...] \\
          [--baseline OTHER/troupe]

--baseline: another troupe binary (an earlier commit's build) run in the
same rounds, the two taking turns going first; the table adds its figures
and troupe / before (every round's figures are on stderr, as JSON).  The
--troupe-arg flags go to both.

Figures compared:
  total t/s  (prompt + generated tokens) / wall time: llama.cpp's S,
             troupe's total_tokens_per_s
  gen t/s    generated tokens / the time spent generating: llama.cpp's
             S_TG (decode phase only, after every prompt is in); troupe's
             rate after the last sequence got its first token
             (decode_phase_tokens_per_s; prefill overlaps decode in
             continuous batching, so this is the closest match)
  step ms    mean time per forward step: llama.cpp's T_TG / G (a 64-row
             decode step); troupe's wall / steps (mixed steps included)

troupe's thread count: PoCL's pthread device uses every core it sees
(POCL_MAX_PTHREAD_COUNT caps it); the script sets it to --threads.
This script never builds llama.cpp.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"batch_vs_llamacpp: {' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    return r


def batched_bench(bin_dir, model, threads, npl, pp, tg, fa):
    n_ctx = npl * (pp + tg)
    cmd = [os.path.join(bin_dir, "llama-batched-bench"), "-m", model, "-t", str(threads),
           "-tb", str(threads), "-c", str(n_ctx), "-b", "2048", "-ub", "512",
           "-npp", str(pp), "-ntg", str(tg), "-npl", str(npl), "--output-format", "jsonl"]
    if fa:
        # Flash attention: llama.cpp's fast path for many sequences.  Since
        # mid-2025 -fa takes a value (on|off|auto); older builds took none.
        cmd += ["-fa", "on"]
    r = run(cmd)
    rows = [json.loads(line) for line in (r.stdout + "\n" + r.stderr).splitlines()
            if line.startswith("{") and '"speed"' in line]
    if not rows:
        sys.exit(f"batch_vs_llamacpp: no result from {' '.join(cmd)}:\n{r.stderr[-3000:]}")
    row = rows[-1]
    return {"total": row["speed"], "gen": row["speed_tg"], "pp": row["speed_pp"],
            "wall": row["t"], "step_ms": row["t_tg"] * 1e3 / tg}


def troupe_batch(troupe, model, threads, npl, pp, tg, extra):
    env = dict(os.environ)
    env["POCL_MAX_PTHREAD_COUNT"] = str(threads)
    cmd = [troupe, "bench", "batch", "-m", model, "--requests", str(npl), "--prompt-len", str(pp),
           "--gen-len", str(tg), "--json"] + extra
    r = run(cmd, env)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return {"total": out["total_tokens_per_s"], "gen": out["decode_phase_tokens_per_s"],
            "gen_wall": out["gen_tokens_per_s"], "wall": out["wall_s"],
            "step_ms": out["mean_step_ms"], "steps": out["steps"],
            "preemptions": out["preemptions"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=64, help="requests in flight (-npl)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--models", default="smollm2,stories15m")
    ap.add_argument("--llama-fa", action="store_true",
                    help="run llama-batched-bench with flash attention (-fa)")
    ap.add_argument("--troupe", default=os.path.join(os.path.dirname(__file__), "..", "build", "troupe"))
    ap.add_argument("--troupe-arg", action="append", default=[],
                    help="extra argument for troupe bench batch (repeatable)")
    ap.add_argument("--baseline", help="an earlier troupe binary, measured in the same rounds")
    args = ap.parse_args()
    bin_dir = os.environ.get("LLAMA_CPP_BIN")
    if not bin_dir or not os.path.isfile(os.path.join(bin_dir, "llama-batched-bench")):
        sys.exit("batch_vs_llamacpp: set LLAMA_CPP_BIN to the folder of an existing llama.cpp build "
                 "(holding llama-batched-bench); this script never builds llama.cpp")
    model_dir = os.environ.get("TROUPE_MODEL_DIR", os.path.expanduser("~/.cache/troupe/models"))
    models = []
    wanted = args.models.split(",")
    if "smollm2" in wanted:
        models.append(("SmolLM2-135M-Instruct Q4_1", "smollm2-135m-instruct",
                       os.path.join(model_dir, "SmolLM2-135M-Instruct.Q4_1.gguf")))
    if "stories15m" in wanted:
        stories = os.environ.get("STORIES_GGUF", os.path.join(model_dir, "stories15M-f32.gguf"))
        if os.path.isfile(stories):
            models.append(("stories15M F32", "stories15m", stories))
        else:
            print(f"note: {stories} missing, stories15M skipped (see docs/peer_llamacpp.md)",
                  file=sys.stderr)

    npl, pp, tg = args.parallel, args.prompt_len, args.gen_len
    print(f"{npl} sequences, prompt {pp}, generate {tg}, {args.threads} threads, "
          f"median of {args.rounds} rounds\n")
    if args.baseline:
        print("| model | figure | llama.cpp | troupe | troupe / llama.cpp | before | troupe / before |")
        print("|---|---|---|---|---|---|---|")
    else:
        print("| model | figure | llama.cpp | troupe | troupe / llama.cpp |")
        print("|---|---|---|---|---|")
    for label, troupe_name, gguf in models:
        peer, ours, before = [], [], []
        # One untimed troupe run first: PoCL compiles each kernel variant on
        # its first launch (then caches it on disk), which llama.cpp, built
        # ahead of time, never pays inside a round.
        print(f"[{label}] warm-up: troupe bench batch, not recorded", file=sys.stderr)
        troupe_batch(args.troupe, troupe_name, args.threads, npl, pp, tg, args.troupe_arg)
        if args.baseline:
            troupe_batch(args.baseline, troupe_name, args.threads, npl, pp, tg, args.troupe_arg)
        for rnd in range(args.rounds):
            print(f"[{label}] round {rnd + 1}/{args.rounds}: llama-batched-bench", file=sys.stderr)
            peer.append(batched_bench(bin_dir, gguf, args.threads, npl, pp, tg, args.llama_fa))
            print(f"  llama.cpp {json.dumps(peer[-1])}", file=sys.stderr)
            # The two troupe binaries take turns going first, so that an
            # order effect (a warm cache, a load that builds up) is shared.
            runs = [("troupe", args.troupe, ours)]
            if args.baseline:
                runs.append(("before", args.baseline, before))
                if rnd % 2:
                    runs.reverse()
            for name, binary, into in runs:
                print(f"[{label}] round {rnd + 1}/{args.rounds}: {name}: troupe bench batch",
                      file=sys.stderr)
                into.append(troupe_batch(binary, troupe_name, args.threads, npl, pp, tg,
                                         args.troupe_arg))
                print(f"  {name} {json.dumps(into[-1])}", file=sys.stderr)

        def med(rows, key):
            return statistics.median(r[key] for r in rows)

        for name, key, unit, higher_better in [("total t/s (prompt + generated)", "total", "t/s", True),
                                               ("generation t/s", "gen", "t/s", True),
                                               ("wall s", "wall", "s", False),
                                               ("step ms", "step_ms", "ms", False)]:
            p, o = med(peer, key), med(ours, key)
            row = f"| {label} | {name} | {p:.2f} | {o:.2f} | {o / p:.2f} |"
            if before:
                b = med(before, key)
                row += f" {b:.2f} | {o / b:.2f} |"
            print(row)
        print(f"| {label} | troupe steps / preemptions | | {med(ours, 'steps'):.0f} / "
              f"{med(ours, 'preemptions'):.0f} | |" + (" | |" if before else ""))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
