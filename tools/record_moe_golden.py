#!/usr/bin/env python3
"""Records llama.cpp's answers on the MoE fixtures (tests/data/moe_golden.json).

Run once, by hand, with a llama.cpp built elsewhere (docs/peer_llamacpp.md);
the tests then compare troupe against what this wrote:

  python3 tools/record_moe_golden.py --llama-bin /path/to/llama.cpp/build/bin \\
      --fixtures ~/.cache/troupe/models/moe --text ../shared/golden/ppl_stories.txt \\
      -o tests/data/moe_golden.json

For each fixture (tools/make_moe_fixtures.py): its sha256; for each prompt
the prompt's tokens (BOS first), 32 greedy tokens from llama-server
(temperature 0, one slot, no prompt cache) and at each of them the gap
between the log-probabilities of llama.cpp's two best candidates; and llama-perplexity's figure on
the text at context 128 (llama.cpp's method: see ../shared/golden/README.md).
"""
import argparse
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
from troupe_client.local_port import free_port  # noqa: E402  (no pyzmq needed)

PROMPTS = ["Once upon a time", "The little dog ran to the park and"]
# Texts that tell byte-level BPE pre-tokenizers apart (digit runs,
# contractions in either case, letters after punctuation, line breaks after
# punctuation and blanks, non-Latin scripts, emoji): their tokens, without
# BOS, are recorded for the fixtures with a gpt2 vocabulary.
TOKENIZE_TEXTS = [
    "Hello world! It's 2026, DON'T you KNOW?",
    "12345678 and 3.14159 cost $1,000,000.",
    "line one\n\n  indented\tline\r\nend  ",
    "na\u00efve caf\u00e9 \u2014 \u00fcn\u00efc\u00f6d\u00e9 \u65e5\u672c\u8a9e "
    "\u30c6\u30b9\u30c8 \U0001f642\U0001f642",
    "  leading spaces and trailing   ",
    "x=y+1;\n\n\nfoo()->bar[2] // comment\n",
    "I'm, you're, we've, they'll, he'd, 'S 'T 'Ll",
    "...!!!\n\nwhy?\n \n(ok)",
]
N_PREDICT = 32
PPL_CTX = 128


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def post(port, path, body):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path),
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def llama_server(bin_dir, model, args):
    """A llama-server on a free loopback port, ready; yields the port."""
    port = free_port()
    proc = subprocess.Popen([os.path.join(bin_dir, "llama-server"), "-m", model, "--port",
                             str(port), "-t", "2", "-np", "1"] + args,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("llama-server did not get ready")
        yield port
    finally:
        proc.kill()
        proc.wait()


def greedy(bin_dir, model, prompts=PROMPTS, n_predict=N_PREDICT):
    with llama_server(bin_dir, model, ["-c", "256", "-fa", "off"]) as port:
        out = []
        for p in prompts:
            toks = post(port, "/tokenize", {"content": p, "add_special": True})["tokens"]
            r = post(port, "/completion", {"prompt": p, "n_predict": n_predict, "temperature": 0,
                                           "top_k": 1, "cache_prompt": False,
                                           "return_tokens": True, "ignore_eos": True})
            # The gap between llama.cpp's two best log-probabilities at each
            # step (where it is tiny, rounding differences may pick the
            # other), one step per request (the first of a few: llama-server
            # reports a token's probabilities only once its text is whole
            # UTF-8, and merges them away in a long completion).
            margins = []
            for i in range(len(r["tokens"])):
                s = post(port, "/completion", {"prompt": toks + r["tokens"][:i], "n_predict": 6,
                                               "temperature": 0, "top_k": 1, "n_probs": 2,
                                               "cache_prompt": False, "ignore_eos": True})
                probs = s.get("completion_probabilities") or [{"id": -1}]
                if probs[0]["id"] != r["tokens"][i]:  # not reported: unknown (null)
                    margins.append(None)
                    continue
                top = probs[0]["top_logprobs"]
                margins.append(round(top[0]["logprob"] - top[1]["logprob"], 4))
            out.append({"prompt": p, "prompt_token_ids": toks, "greedy_token_ids": r["tokens"],
                        "top2_margin": margins})
        return out


def tokenized(bin_dir, model):
    with llama_server(bin_dir, model, ["-c", "256"]) as port:
        return [{"text": t,
                 "token_ids": post(port, "/tokenize", {"content": t, "add_special": False})[
                     "tokens"]} for t in TOKENIZE_TEXTS]


def is_bpe(model):
    """True when the GGUF's vocabulary is byte-level BPE (tokenizer.ggml.model gpt2)."""
    with open(model, "rb") as f:
        head = f.read(1 << 16)
    return b"tokenizer.ggml.model" in head and b"gpt2" in head


def perplexity(bin_dir, model, text, ctx=PPL_CTX):
    # llama-perplexity's logger often exits before it writes its last lines
    # (the October 2026 build): the running figure after the last chunk is
    # the final one, and the run is repeated until either shows.
    for _ in range(20):
        r = subprocess.run([os.path.join(bin_dir, "llama-perplexity"), "-m", model, "-f", text,
                            "-c", str(ctx), "-b", str(ctx), "-t", "2", "-fa", "off"],
                           capture_output=True, text=True, check=True)
        out = r.stdout + r.stderr
        m = re.search(r"Final estimate: PPL = ([0-9.]+)", out)
        if m:
            return float(m.group(1))
        chunks = re.search(r"perplexity over (\d+) chunks", out)
        last = chunks and re.search(r"\[%s\]([0-9.]+)," % chunks.group(1), out)
        if last:
            return float(last.group(1))
    raise RuntimeError("no PPL in llama-perplexity's output")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--commit", default="", help="the llama.cpp commit, for the record")
    ap.add_argument("--only", nargs="*",
                    help="record these fixtures and keep the others' records from --out")
    args = ap.parse_args()
    fixtures = {}
    if args.only and os.path.exists(args.out):
        with open(args.out) as f:
            fixtures = json.load(f)["fixtures"]
    for f in sorted(os.listdir(args.fixtures)):
        if not f.endswith(".gguf") or (args.only and f[:-5] not in args.only):
            continue
        path = os.path.join(args.fixtures, f)
        name = f[:-5]
        print("[record] %s" % name, file=sys.stderr)
        fixtures[name] = {
            "sha256": sha256(path),
            "greedy": greedy(args.llama_bin, path),
            "ppl_ctx": PPL_CTX,
            "ppl": perplexity(args.llama_bin, path, args.text),
        }
        if is_bpe(path):
            fixtures[name]["tokenize"] = tokenized(args.llama_bin, path)
    with open(args.out, "w") as f:
        json.dump({"llama_cpp": args.commit, "n_predict": N_PREDICT, "fixtures": fixtures}, f,
                  indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
