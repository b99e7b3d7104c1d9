#!/usr/bin/env python3
"""Records llama.cpp's embeddings of real models (tests/data/embedding_golden.json).

Run once, by hand, with the llama.cpp of docs/peer_llamacpp.md (October 2026,
built elsewhere); the tests compare troupe's /v1/embeddings against it:

  python3 tools/record_embedding_golden.py --llama-bin /path/to/llama.cpp/build/bin \\
      --model smollm2-135m-instruct=$HOME/.cache/troupe/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --model gemma3-270m=$HOME/.cache/troupe/models/gemma-3-270m-q4_k_m.gguf \\
      -o tests/data/embedding_golden.json

For each model: its sha256, and for each prompt llama-server's
/v1/embeddings vector with `--embeddings --pooling mean` (the final normed
hidden states mean-pooled, L2-normalised: --embd-normalize 2, its default;
-fa off, llama.cpp's default numerics, which troupe's half KV cache follows)
and the prompt's token count.  One prompt is long enough (over 600 tokens)
to take several prefill chunks in troupe.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record_moe_golden import llama_server, post, sha256  # noqa: E402

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores the KV cache in fixed-size blocks.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    " ".join("Sentence number %d of a long document about serving language models." % i
             for i in range(48)),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--model", action="append", required=True, help="NAME=PATH (repeatable)")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    models = {}
    for spec in args.model:
        name, path = spec.split("=", 1)
        print("[record] %s" % name, file=sys.stderr)
        with llama_server(args.llama_bin, path,
                          ["-c", "2048", "-b", "2048", "-ub", "2048", "-fa", "off", "--embeddings",
                           "--pooling", "mean"]) as port:
            got = []
            for p in PROMPTS:
                r = post(port, "/v1/embeddings", {"input": p})
                got.append({"prompt": p, "prompt_tokens": r["usage"]["prompt_tokens"],
                            "embedding": [round(v, 7) for v in r["data"][0]["embedding"]]})
        models[name] = {"sha256": sha256(path), "embeddings": got}
    with open(args.out, "w") as f:
        json.dump({"pooling": "mean", "normalize": "l2", "models": models}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
