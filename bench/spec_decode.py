#!/usr/bin/env python3
"""Speculative decoding (n-gram drafts) on and off, on workloads that repeat
themselves and on one that does not.

Starts one `troupe serve` (speculative decoding off by default) and sends
each workload's requests one at a time, each with draft_tokens 0 and then
with each --drafts value (per request, through `troupe client
--draft-tokens`).  Reports time per output token (the server's TPOT: decode
time after the first token / tokens after the first), its ratio to drafts
off, the acceptance rate (accepted / drafted, from the instance's counters)
and accepted tokens per decode step; checks that every output equals the
one without drafts.

  python3 bench/spec_decode.py [--model smollm2-135m-instruct] [--drafts 4 8] \\
      [--max-tokens 128] [--repeats 3]

Workloads:
  copy     a passage of ../shared/golden/ppl_stories.txt, then its beginning
           again: the model goes on copying (quoting summaries, retrieval)
  code     a chat request to rename a variable in a short function: the
           answer repeats the code with small changes (code edits)
  sampled  the opening of a story, continued with sampling (temperature
           0.9, a fixed seed): free text that rarely repeats; drafts mostly
           miss (the cost).  Seeded sampling is reproducible, so the output
           is still checked against drafts off.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "tools", "python"))
from troupe_client.local_port import free_port  # noqa: E402  (no pyzmq needed)

CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax
'''


def workloads(seed, passage_words):
    text = open(os.path.join(REPO, "..", "shared", "golden", "ppl_stories.txt")).read()
    words = text.split()
    rng = random.Random(seed)
    out = {"copy": [], "code": [], "sampled": []}
    for i in range(3):
        start = rng.randrange(0, len(words) - 200)
        passage = " ".join(words[start:start + passage_words])
        out["copy"].append(("prompt", passage + "\n\n" + passage[:len(passage) // 3]))
        name = ["subtotal", "items", "tax"][i]
        out["code"].append(("chat", f"Rewrite this Python function, renaming the variable "
                                    f"`{name}` to `{name}_value`. Reply with the code only.\n\n"
                                    + CODE))
        out["sampled"].append(("sampled", " ".join(words[start:start + 30])))
    return out


class server:
    def __init__(self, troupe, model, extra):
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.troupe = troupe
        self.proc = subprocess.Popen([troupe, "serve", "-m", model, "--listen", self.endpoint]
                                     + extra, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while time.time() < deadline:
            if subprocess.run([troupe, "client", "-s", self.endpoint, "ping"],
                              capture_output=True).returncode == 0:
                return
            if self.proc.poll() is not None:
                sys.exit("spec_decode: the server exited:\n" + self.proc.stderr.read().decode())
            time.sleep(0.5)
        self.stop()
        sys.exit("spec_decode: the server did not answer within 120 s")

    def stop(self):
        self.proc.kill()
        self.proc.wait()

    def generate(self, kind, text, max_tokens, drafts):
        args = [self.troupe, "client", "-s", self.endpoint, "--json", "-n", str(max_tokens),
                "--ignore-eos", "--draft-tokens", str(drafts)]
        args += ["--chat", text] if kind == "chat" else ["-p", text]
        if kind == "sampled":
            args += ["--temperature", "0.9", "--seed", "1"]
        r = subprocess.run(args, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            sys.exit(f"spec_decode: client failed: {r.stderr[-2000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    def counters(self):
        r = subprocess.run([self.troupe, "client", "-s", self.endpoint, "--json", "admin",
                            "instances"], capture_output=True, text=True, timeout=60)
        rows = json.loads(r.stdout)
        rows = rows if isinstance(rows, list) else rows.get("instances", [rows])
        return {k: sum(x.get(k, 0) for x in rows)
                for k in ("draft_tokens", "accepted_tokens", "steps", "decode_tokens")}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--drafts", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each request per setting")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--passage-words", type=int, default=120,
                    help="words of the copy workload's passage (stories15M: 50, its context is 256)")
    ap.add_argument("--troupe", default=os.path.join(REPO, "build", "troupe"))
    ap.add_argument("--serve-arg", action="append", default=[])
    args = ap.parse_args()
    srv = server(args.troupe, args.model, args.serve_arg)
    try:
        rows = []
        for name, reqs in workloads(args.seed, args.passage_words).items():
            if args.model == "stories15m" and name == "code":
                continue  # no chat template, and no code in its training
            per = {d: {"tpot": [], "drafted": 0, "accepted": 0, "steps": 0} for d in
                   [0] + args.drafts}
            for kind, text in reqs:
                want = None
                for rep in range(args.repeats):
                    for d in [0] + args.drafts:
                        before = srv.counters()
                        out = srv.generate(kind, text, args.max_tokens, d)
                        after = srv.counters()
                        if want is None:
                            want = out["token_ids"]
                        elif out["token_ids"] != want:
                            sys.exit(f"spec_decode: {name} output with {d} drafts differs")
                        per[d]["tpot"].append(out["timing"]["tpot_ms"])
                        per[d]["drafted"] += after["draft_tokens"] - before["draft_tokens"]
                        per[d]["accepted"] += after["accepted_tokens"] - before["accepted_tokens"]
                        per[d]["steps"] += after["steps"] - before["steps"]
                print(f"[{name}] request done", file=sys.stderr, flush=True)
            base = statistics.median(per[0]["tpot"])
            for d in [0] + args.drafts:
                p = per[d]
                tpot = statistics.median(p["tpot"])
                acc = p["accepted"] / p["drafted"] if p["drafted"] else 0.0
                toks = args.max_tokens * len(reqs) * args.repeats
                rows.append((name, d, tpot, base / tpot, acc, toks / max(p["steps"], 1)))
        print(f"model {args.model}, {args.max_tokens} tokens per request, greedy, "
              f"median TPOT over {args.repeats} runs of each request\n")
        print("| workload | draft tokens | TPOT ms | speed-up | accepted / drafted | "
              "tokens per step |")
        print("|---|---|---|---|---|---|")
        for name, d, tpot, up, acc, tps in rows:
            print(f"| {name} | {d} | {tpot:.2f} | {up:.2f} | {acc:.2f} | {tps:.2f} |")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
