#!/usr/bin/env python3
"""The KV store's tiers on multi-turn chat whose histories outgrow the
device arena (issue 39's first must-show).

Starts `troupe serve` twice on the same model and arena: without tiers, then
with a host tier (--kv-host-mb) and optionally a disk tier (--kv-disk-dir).
Each run drives the same conversations, visited in turn (conversation 1's
turn 1, conversation 2's turn 1, ..., then everyone's turn 2): each turn
resends the whole history (a system prompt, earlier user messages and the
model's own greedy answers) plus a new user message.  The histories
together are many times the arena, so by the time a conversation comes
back the arena has evicted it.

Reports, for later turns (turn 2 on): the share of prompt tokens the server
found cached, TTFT p50 and p99 (the server's, arrival to first token), and
the ratio with tiers against without; checks that every answer is the same
greedy tokens in both runs (exit 1 if not).

  python3 bench/kv_tiers.py [--model smollm2-135m-instruct] [--kv-mb 16] \\
      [--kv-host-mb 512] [--kv-disk-dir DIR] [--conversations 10] [--turns 6]
"""
import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "tools", "python"))
from troupe_client import Client  # noqa: E402
from troupe_client.local_port import free_port  # noqa: E402


class Server:
    def __init__(self, troupe, model, args):
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen([troupe, "serve", "-m", model, "--listen", self.endpoint] + args,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        deadline = time.time() + 120
        for line in self.proc.stdout:
            if line.startswith("troupe serve: listening on "):
                return
            if time.time() > deadline:
                break
        self.proc.kill()
        sys.exit("kv_tiers: the server did not start")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def conversations(n, system_len, user_len, turns, seed, first_id=300, vocab=49152):
    rng = random.Random(seed)
    pick = lambda k: [rng.randrange(first_id, vocab) for _ in range(k)]  # noqa: E731
    return [{"system": pick(system_len), "users": [pick(user_len) for _ in range(turns)]}
            for _ in range(n)]


def run(server, convs, turns, output_len):
    """Every conversation's turns, visited in turn; per turn its answer,
    cached prompt tokens, prompt tokens and the server's TTFT."""
    client = Client(server.endpoint)
    history = [list(c["system"]) for c in convs]
    out = []
    for t in range(turns):
        for i, c in enumerate(convs):
            history[i] += c["users"][t]
            r = client.generate(history[i], stream=False, max_tokens=output_len, temperature=0,
                                ignore_eos=True)
            if r.finish_reason not in ("length", "eos", "stop"):
                sys.exit(f"kv_tiers: conversation {i} turn {t}: {r.finish_reason}")
            out.append({"conv": i, "turn": t, "tokens": list(r.token_ids), "cached": r.cached_tokens,
                        "prompt": r.prompt_tokens, "ttft_ms": r.ttft_ms})
            history[i] += list(r.token_ids)
    client.close()
    return out


def summary(rows):
    later = [r for r in rows if r["turn"] > 0]
    ttft = sorted(r["ttft_ms"] for r in later)
    p99 = ttft[min(len(ttft) - 1, int(round(0.99 * (len(ttft) - 1))))]
    return {"cached": sum(r["cached"] for r in later) / max(1, sum(r["prompt"] for r in later)),
            "p50": statistics.median(ttft), "p99": p99,
            "prompt": sum(r["prompt"] for r in rows)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--troupe", default=os.path.join(REPO, "build", "troupe"))
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--kv-mb", type=int, default=16)
    ap.add_argument("--kv-host-mb", type=int, default=512)
    ap.add_argument("--kv-disk-dir", default="")
    ap.add_argument("--kv-disk-mb", type=int, default=4096)
    ap.add_argument("--conversations", type=int, default=10)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-len", type=int, default=128)
    ap.add_argument("--user-len", type=int, default=48)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    convs = conversations(a.conversations, a.system_len, a.user_len, a.turns, a.seed)
    base = ["--kv-mb", str(a.kv_mb)]
    tiers = base + ["--kv-host-mb", str(a.kv_host_mb)]
    if a.kv_disk_dir:
        shutil.rmtree(a.kv_disk_dir, ignore_errors=True)
        tiers += ["--kv-disk-dir", a.kv_disk_dir, "--kv-disk-mb", str(a.kv_disk_mb)]
    results = {}
    for name, args in (("no tiers", base), ("tiers", tiers)):
        print(f"kv_tiers: {name}: troupe serve -m {a.model} {' '.join(args)}", file=sys.stderr)
        server = Server(a.troupe, a.model, args)
        try:
            results[name] = run(server, convs, a.turns, a.output_len)
        finally:
            server.stop()
    same = all(x["tokens"] == y["tokens"] for x, y in zip(results["no tiers"], results["tiers"]))
    s0, s1 = summary(results["no tiers"]), summary(results["tiers"])
    print(f"{a.conversations} conversations x {a.turns} turns, {a.model}, --kv-mb {a.kv_mb}; "
          f"prompt tokens sent: {s0['prompt']}")
    print("| run | later turns' prompt tokens cached | TTFT p50 (ms) | TTFT p99 (ms) |")
    print("|---|---|---|---|")
    print(f"| without tiers | {100 * s0['cached']:.1f}% | {s0['p50']:.0f} | {s0['p99']:.0f} |")
    print(f"| {' '.join(tiers[2:])} | {100 * s1['cached']:.1f}% | {s1['p50']:.0f} | {s1['p99']:.0f} |")
    print(f"TTFT p50 ratio (tiers / none): {s1['p50'] / s0['p50']:.2f}; "
          f"greedy answers equal: {'yes' if same else 'NO'}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
