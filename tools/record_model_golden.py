#!/usr/bin/env python3
"""Records llama.cpp's answers on real models (tests/data/model_golden.json).

Run once, by hand, with the llama.cpp of docs/peer_llamacpp.md (October 2026,
built elsewhere); the tests then compare troupe against what this wrote:

  python3 tools/record_model_golden.py --llama-bin /path/to/llama.cpp/build/bin \\
      --model gemma3-270m=$HOME/.cache/troupe/models/gemma-3-270m-q4_k_m.gguf \\
      --text ../shared/golden/ppl_stories.txt --long-text tests/data/ppl_long.txt \\
      -o tests/data/model_golden.json

For each model: its sha256; for each of eight prompts the prompt's tokens,
64 greedy tokens from llama-server (-fa off: llama.cpp's default numerics,
which troupe's half KV cache follows) with llama.cpp's top-2 gap at each
(tools/record_moe_golden.py says how); llama-perplexity's figure on the
short text at context 128 and on the long one at context 1024 (past a
512-token sliding window).  With --ppl-only, the figure at context 128
alone:

  python3 tools/record_model_golden.py --llama-bin ... --ppl-only \
      --model gemma3-softcap30=$HOME/.cache/troupe/models/fixtures/gemma3-softcap30.gguf \
      --text ../shared/golden/ppl_stories.txt --long-text tests/data/ppl_long.txt \
      -o tests/data/model_golden.json
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record_moe_golden import greedy, perplexity, sha256  # noqa: E402

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):",
           "In the beginning", "The quick brown fox", "Water boils at",
           "My favourite food is", "The history of the Roman Empire"]
N_PREDICT = 64


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--model", action="append", required=True, help="NAME=PATH (repeatable)")
    ap.add_argument("--text", required=True, help="perplexity text at context 128")
    ap.add_argument("--long-text", required=True, help="perplexity text at context 1024")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--commit", default="", help="the llama.cpp version, for the record")
    ap.add_argument("--ppl-only", action="store_true",
                    help="record the perplexity at context 128 alone (for a copy of a recorded "
                         "model whose greedy tokens are that model's, such as the softcapped "
                         "copy tools/make_softcap_fixture.py writes)")
    ap.add_argument("--host", default="", help="the machine it ran on, for the record")
    args = ap.parse_args()
    models = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            models = json.load(f)["models"]
    for spec in args.model:
        name, path = spec.split("=", 1)
        print("[record] %s" % name, file=sys.stderr)
        if args.ppl_only:
            models[name] = {"sha256": sha256(path),
                            "ppl": {"128": perplexity(args.llama_bin, path, args.text, 128)}}
        else:
            models[name] = {
                "sha256": sha256(path),
                "greedy": greedy(args.llama_bin, path, PROMPTS, N_PREDICT),
                "ppl": {"128": perplexity(args.llama_bin, path, args.text, 128),
                        "1024": perplexity(args.llama_bin, path, args.long_text, 1024)},
            }
        if args.host:
            models[name]["host"] = args.host
    with open(args.out, "w") as f:
        json.dump({"llama_cpp": args.commit, "n_predict": N_PREDICT, "models": models}, f,
                  indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
