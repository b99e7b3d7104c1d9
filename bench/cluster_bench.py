#!/usr/bin/env python3
"""The cluster benchmarks of issue 10 (not in CI: they take minutes and
want a quiet machine).  Everything runs as real processes on 127.0.0.1:
`troupe node`s, one `troupe serve` with no local instance, and the load
from `troupe bench serve` or the Python client.

  python3 bench/cluster_bench.py [--troupe build/troupe] [--parts instances,migration,recovery]
      [--report docs/bench_cluster.md]

instances  1 vs 2 engine instances on one node under the same load, for
           stories15M and SmolLM2-135M: one instance with one PoCL thread,
           two instances with one thread each (POCL_MAX_PTHREAD_COUNT=2 for
           the node, whose instances share PoCL's pool), and one instance
           with both threads.  Load: a closed loop of 8 clients, 32 requests
           of 128 random prompt tokens and 64 output tokens.
migration  a streaming request of L prompt tokens (L = 128, 512, 1024,
           SmolLM2-135M) moved between two nodes through `admin migrate`:
           the KV bytes moved and the migration's time (export asked to
           import answered, the request's trace), against recomputing it:
           the TTFT of the same prompt on an idle instance with no prefix
           cache (what recovery by recompute pays), and the longest gap in
           the client's token stream across each.
recovery   kill -9 of one of two nodes while 12 greedy requests stream:
           the time from the kill to the router marking its instance down
           (the service's log) and to each request's first token after
           the kill; five repetitions.
handoff    PD hand-off between two nodes (SmolLM2-135M, --pd): the KV
           transfer's time and the client's stall between the first token
           and the second, for L = 128, 512, 1024 prompt tokens.
copies     kill -9 of the node a 1024-token request decodes on, without
           and with KV copies (--kv-copy always): the client's stall
           after the kill, the tokens loaded from the copy, and whether
           the greedy tokens are the same.
"""
import argparse
import datetime
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "tools", "python"))
from troupe_client.local_port import free_port  # noqa: E402  (no pyzmq needed)


def die(msg):
    sys.exit(f"cluster_bench: {msg}")


class Child:
    """A troupe process; ready once a stdout line starts with `ready`."""

    def __init__(self, args, ready, env=None, timeout=120):
        self.err = tempfile.NamedTemporaryFile(prefix="cluster_bench_", suffix=".err", delete=False)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env={**os.environ, **(env or {})})
        self.lines = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if line.startswith(ready):
                return
        err = self.stderr()
        self.stop()
        die(f"{' '.join(args)} did not get ready: {''.join(self.lines)} {err}")

    def stderr(self):
        with open(self.err.name) as f:
            return f.read()

    def kill9(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill9()
        os.unlink(self.err.name)


class Cluster:
    """Nodes (each hosting `instances` instances) and one service over them."""

    def __init__(self, troupe, model, nodes, secret, threads=None, serve_args=()):
        self.troupe = troupe
        env = {"POCL_MAX_PTHREAD_COUNT": str(threads)} if threads else {}
        self.nodes, addresses = [], []
        for _ in nodes:
            port = free_port()
            self.nodes.append(Child([troupe, "node", "--listen", f"127.0.0.1:{port}",
                                     "--cluster-secret-file", secret],
                                    "troupe node: listening on", env))
            addresses.append(f"127.0.0.1:{port}")
        self.addresses = addresses
        self.config = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
        self.config.write(f'[cluster]\nsecret_file = "{secret}"\n')
        for address, n in zip(addresses, nodes):
            self.config.write(f'[[cluster.node]]\naddress = "{address}"\ninstances = {n}\n')
        self.config.close()
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.serve = Child([troupe, "serve", "-m", model, "--listen", self.endpoint, "-c",
                            self.config.name, *serve_args], "troupe serve: listening on")

    def admin(self, *args):
        r = subprocess.run([self.troupe, "client", "--server", self.endpoint, "admin", *args,
                            "--json"], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"admin {' '.join(args)}: {r.stderr.strip()}")
        return json.loads(r.stdout)

    def close(self):
        self.serve.stop()
        for n in self.nodes:
            n.stop()
        os.unlink(self.config.name)


def secret_file():
    f = tempfile.NamedTemporaryFile("w", prefix="cluster_bench_", suffix=".secret", delete=False)
    f.write(f"cluster-bench-{random.getrandbits(64)}")
    f.close()
    os.chmod(f.name, 0o600)
    return f.name


def part_instances(args, secret):
    rows = []
    for model in ["stories15m", "smollm2-135m-instruct"]:
        for label, instances, threads in [("1 instance, 1 PoCL thread", 1, 1),
                                          ("2 instances, 1 PoCL thread each", 2, 2),
                                          ("1 instance, 2 PoCL threads", 1, 2)]:
            print(f"instances: {model}, {label}", flush=True)
            c = Cluster(args.troupe, model, [instances], secret, threads,
                        ["--router", "least-load", "--kv-mb", "64"])
            out = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
            try:
                subprocess.run([args.troupe, "bench", "serve", "--server", c.endpoint,
                                "--num-requests", "32", "--max-concurrency", "8",
                                "--random-input-len", "128", "--random-output-len", "64",
                                "--ignore-eos", "--seed", "1", "--num-warmups", "2",
                                "--no-progress", "--json-out", out],
                               check=True, capture_output=True, timeout=1800)
                with open(out) as f:
                    m = json.load(f)
            finally:
                c.close()
                os.unlink(out)
            rows.append({"model": model, "config": label, "completed": m["completed"],
                         "output_tok_s": m["output_throughput"],
                         "ttft_median_ms": m["ttft_ms"]["median"],
                         "tpot_median_ms": m["tpot_ms"]["median"]})
    return rows


class Streamer(threading.Thread):
    """One streaming request on its own client (a Client is not thread-safe),
    timing each token as it arrives."""

    def __init__(self, endpoint, prompt, request_id, **options):
        super().__init__(daemon=True)
        self.endpoint, self.prompt, self.request_id, self.options = (endpoint, prompt, request_id,
                                                                     options)
        self.times, self.result, self.error = [], None, None
        self.start()

    def run(self):
        from troupe_client import Client

        try:
            with Client(self.endpoint) as cl:
                stream = cl.generate(self.prompt, request_id=self.request_id, **self.options)
                for chunk in stream:
                    now = time.time() * 1000
                    self.times.extend([now] * max(1, len(chunk.token_ids)))
                self.result = stream.result
        except Exception as e:  # a refusal or a timeout: reported, not raised
            self.error = str(e)

    def wait_tokens(self, n, timeout=120):
        deadline = time.monotonic() + timeout
        while len(self.times) < n and self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.002)

    def longest_gap_after(self, t_ms):
        """(gap ms, ms from t_ms to the token ending it) of the longest silence after t_ms."""
        best = (0.0, None)
        prev = t_ms
        for t in self.times:
            if t <= t_ms:
                continue
            if t - prev > best[0]:
                best = (t - prev, t - t_ms)
            prev = t
        return best


def part_migration(args, secret):
    rows = []
    # SmolLM2: stories15M's context is 256 tokens.
    c = Cluster(args.troupe, "smollm2-135m-instruct", [1, 1], secret, None,
                ["--router", "round-robin", "--prefix-caching", "false", "--kv-mb", "128"])
    rng = random.Random(1)
    rid = 1
    try:
        for length in [128, 512, 1024]:
            prompt = [rng.randrange(256, 32000) for _ in range(length)]
            for rep in range(3):
                # Recompute: the same prompt prefilled on an idle instance.
                rid += 1
                r = Streamer(c.endpoint, prompt, rid, max_tokens=8, ignore_eos=True)
                r.join(300)
                recompute_ms = c.admin("trace", str(rid))["ttft_ms"]
                # Migration: stream, move after 8 tokens.
                rid += 1
                m = Streamer(c.endpoint, prompt, rid, max_tokens=96, ignore_eos=True)
                m.wait_tokens(8)
                if m.error or len(m.times) < 8:
                    die(f"the request of {length} tokens did not stream: {m.error}")
                where = c.admin("trace", str(rid))["instances"][-1]
                asked = time.time() * 1000
                c.admin("migrate", str(rid), "2" if where == 1 else "1")
                m.join(300)
                t = c.admin("trace", str(rid))
                gaps = [b - a for a, b in zip(m.times, m.times[1:])]
                rows.append({"context": length, "rep": rep, "kv_bytes": t["migrated_bytes"],
                             "migration_ms": t["migration_ms"], "recompute_ms": recompute_ms,
                             "stall_ms": m.longest_gap_after(asked)[0],
                             "median_gap_ms": statistics.median(gaps) if gaps else 0,
                             "tokens": len(m.times), "migrations": t["migrations"],
                             "error": m.error})
                print(f"migration: L={length} rep {rep}: {rows[-1]}", flush=True)
    finally:
        c.close()
    return rows


def log_ms(text, what):
    """spdlog time (local, ms since the epoch) of the first line containing `what`."""
    for line in text.splitlines():
        if what in line:
            m = re.match(r"\[(\d+-\d+-\d+ \d+:\d+:\d+)\.(\d+)\]", line)
            if m:
                t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
                return t.timestamp() * 1000 + int(m.group(2))
    return None


def part_recovery(args, secret):
    rows = []
    prompt = "Once upon a time, there was a little girl named Lily"
    for rep in range(5):
        c = Cluster(args.troupe, "stories15m", [1, 1], secret, None, ["--router", "round-robin"])
        try:
            streams = [Streamer(c.endpoint, prompt, 100 + i, max_tokens=160, ignore_eos=True)
                       for i in range(12)]
            for s in streams:
                s.wait_tokens(4)
            kill_ms = time.time() * 1000
            c.nodes[rep % 2].kill9()
            for s in streams:
                s.join(300)
            down = log_ms(c.serve.stderr(), "is down")
            victims = [s for s in streams
                       if c.admin("trace", str(s.request_id))["recoveries"] > 0]
            resumed = [s.longest_gap_after(kill_ms)[1] for s in victims]
            resumed = [r for r in resumed if r is not None]
            errors = sum(1 for s in streams
                         if s.error or (s.result and s.result.finish_reason == "error"))
            rows.append({"rep": rep, "detect_ms": down - kill_ms if down else None,
                         "victims": len(victims),
                         "first_recovered_ms": min(resumed) if resumed else None,
                         "last_recovered_ms": max(resumed) if resumed else None,
                         "errors": errors})
            print(f"recovery: {rows[-1]}", flush=True)
        finally:
            c.close()
    return rows


def part_handoff(args, secret):
    """PD hand-off between two nodes: prefill on one, decode on the other."""
    rows = []
    c = Cluster(args.troupe, "smollm2-135m-instruct", [1, 1], secret, None,
                ["--pd", "--roles", "prefill,decode", "--prefix-caching", "false",
                 "--kv-mb", "128"])
    rng = random.Random(2)
    rid = 500
    try:
        for length in [128, 512, 1024]:
            prompt = [rng.randrange(256, 32000) for _ in range(length)]
            for rep in range(3):
                rid += 1
                s = Streamer(c.endpoint, prompt, rid, max_tokens=16, ignore_eos=True)
                s.join(300)
                if s.error or len(s.times) < 2:
                    die(f"the hand-off request of {length} tokens failed: {s.error}")
                t = c.admin("trace", str(rid))
                rows.append({"context": length, "rep": rep, "kv_bytes": t["transfer_bytes"],
                             "transfer_ms": t["transfer_ms"],
                             "stall_ms": s.times[1] - s.times[0],
                             "median_gap_ms": statistics.median(
                                 b - a for a, b in zip(s.times[1:], s.times[2:]))})
                print(f"handoff: L={length} rep {rep}: {rows[-1]}", flush=True)
    finally:
        c.close()
    return rows


def part_copies(args, secret):
    """kill -9 of the node a long request decodes on: recompute vs KV copies."""
    rows = []
    rng = random.Random(3)
    prompt = [rng.randrange(256, 32000) for _ in range(1024)]
    for mode in ["recompute", "copies"]:
        extra = ["--router", "round-robin", "--prefix-caching", "true", "--kv-mb", "128",
                 "--kv-host-mb", "256"]
        if mode == "copies":
            extra += ["--kv-copy", "always", "--kv-copy-pages", "4"]
        for rep in range(3):
            c = Cluster(args.troupe, "smollm2-135m-instruct", [1, 1], secret, None, extra)
            try:
                rid = 900 + rep
                s = Streamer(c.endpoint, prompt, rid, max_tokens=64, ignore_eos=True)
                s.wait_tokens(16)
                where = c.admin("trace", str(rid))["instances"][-1]
                node = [i for i in c.admin("instances") if i["id"] == where][0]["node"]
                kill_ms = time.time() * 1000
                c.nodes[c.addresses.index(node)].kill9()
                s.join(300)
                t = c.admin("trace", str(rid))
                gap, _ = s.longest_gap_after(kill_ms)
                rows.append({"mode": mode, "rep": rep, "resume_ms": gap,
                             "tier_tokens": t["tier_tokens"], "recoveries": t["recoveries"],
                             "tokens": len(s.times), "error": s.error,
                             "token_ids": s.result.token_ids if s.result else []})
                print(f"copies: {mode} rep {rep}: "
                      f"{ {k: v for k, v in rows[-1].items() if k != 'token_ids'} }", flush=True)
            finally:
                c.close()
    first = rows[0]["token_ids"]
    for r in rows:
        r["same_tokens"] = r["token_ids"] == first
        del r["token_ids"]
    return rows


def ms(x):
    return "-" if x is None else f"{x:.0f}"


def table(rows, cols):
    out = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(f(r) for _, f in cols) + " |")
    return "\n".join(out)


def report(args, results):
    lines = [f"# Cluster benchmarks (issue 10)", "",
             f"Run {datetime.date.today()} on this machine ({os.cpu_count()} cores), "
             f"`python3 bench/cluster_bench.py --parts {args.parts}`.  Real processes on "
             "127.0.0.1: `troupe node`s over the cluster's TLS and a `troupe serve` with no "
             "local instance.", ""]
    if "instances" in results:
        rows = results["instances"]
        lines += ["## 1 vs 2 instances on one node", "",
                  "A closed loop of 8 clients, 32 requests of 128 random prompt tokens and 64 "
                  "output tokens (`troupe bench serve --max-concurrency 8`).  Ratios are "
                  "against the one-instance, one-thread row of the same model.", ""]
        base = {r["model"]: r["output_tok_s"] for r in rows if r["config"].startswith("1 instance, 1")}
        lines.append(table(rows, [
            ("model", lambda r: r["model"]), ("configuration", lambda r: r["config"]),
            ("output tok/s", lambda r: f"{r['output_tok_s']:.1f}"),
            ("ratio", lambda r: f"{r['output_tok_s'] / base[r['model']]:.2f}"),
            ("median TTFT ms", lambda r: f"{r['ttft_median_ms']:.0f}"),
            ("median TPOT ms", lambda r: f"{r['tpot_median_ms']:.1f}")]))
        lines.append("")
    if "migration" in results:
        rows = results["migration"]
        lines += ["## Migration against recompute", "",
                  "SmolLM2-135M, a request of L random prompt tokens streaming 96 tokens, moved "
                  "between two nodes after 8 (`admin migrate`).  Migration: export asked to "
                  "import answered (the request's trace, `migration_ms`).  Recompute: the TTFT "
                  "of the same prompt on an idle instance with no prefix cache.  Stall: the "
                  "longest silence in the client's stream after the migrate command was sent "
                  "(it includes starting `troupe client`); median gap: between consecutive "
                  "tokens over the whole stream.  Medians of 3 runs.", ""]
        agg = []
        for L in sorted({r["context"] for r in rows}):
            rs = [r for r in rows if r["context"] == L]
            med = lambda k: statistics.median(r[k] for r in rs)
            agg.append({"L": L, "kv": med("kv_bytes"), "mig": med("migration_ms"),
                        "rec": med("recompute_ms"), "gap": med("stall_ms"),
                        "mgap": med("median_gap_ms")})
        lines.append(table(agg, [
            ("context", lambda r: str(r["L"])), ("KV bytes", lambda r: f"{r['kv'] / 1e6:.2f} MB"),
            ("migration ms", lambda r: f"{r['mig']:.1f}"),
            ("recompute ms", lambda r: f"{r['rec']:.1f}"),
            ("recompute / migration", lambda r: f"{r['rec'] / r['mig']:.2f}" if r["mig"] else "-"),
            ("stall ms", lambda r: f"{r['gap']:.1f}"),
            ("median gap ms", lambda r: f"{r['mgap']:.1f}")]))
        lines.append("")
    if "handoff" in results:
        rows = results["handoff"]
        lines += ["## PD hand-off between two nodes", "",
                  "SmolLM2-135M with `--pd --roles prefill,decode`: a request of L random "
                  "prompt tokens prefills on one node and decodes on the other.  Transfer: "
                  "the trace's `transfer_ms` (export asked to import answered); stall: the "
                  "client's gap between the first token (from the prefill node) and the "
                  "second (from the decode node).  Medians of 3 runs.", ""]
        agg = []
        for L in sorted({r["context"] for r in rows}):
            rs = [r for r in rows if r["context"] == L]
            med = lambda k: statistics.median(r[k] for r in rs)
            agg.append({"L": L, "kv": med("kv_bytes"), "tr": med("transfer_ms"),
                        "stall": med("stall_ms"), "gap": med("median_gap_ms")})
        lines.append(table(agg, [
            ("context", lambda r: str(r["L"])), ("KV bytes", lambda r: f"{r['kv'] / 1e6:.2f} MB"),
            ("transfer ms", lambda r: f"{r['tr']:.1f}"),
            ("stall ms", lambda r: f"{r['stall']:.1f}"),
            ("median gap ms", lambda r: f"{r['gap']:.1f}")]))
        lines.append("")
    if "copies" in results:
        rows = results["copies"]
        lines += ["## Recovery after kill -9: recompute against KV copies", "",
                  "SmolLM2-135M, two nodes with `--kv-host-mb 256`, one request of 1024 "
                  "random prompt tokens streaming 64; after 16 tokens the node it runs on is "
                  "killed.  Resume: the longest silence in the client's stream after the kill "
                  "(detection, placement, then recompute or loading the copy).  Tier tokens: "
                  "the resumed admission's tokens loaded from a KV store (the trace).", ""]
        lines.append(table(rows, [
            ("mode", lambda r: r["mode"]), ("run", lambda r: str(r["rep"])),
            ("resume ms", lambda r: f"{r['resume_ms']:.0f}"),
            ("tier tokens", lambda r: str(r["tier_tokens"])),
            ("recoveries", lambda r: str(r["recoveries"])),
            ("tokens", lambda r: str(r["tokens"])),
            ("same tokens", lambda r: "yes" if r["same_tokens"] else "NO"),
            ("error", lambda r: r["error"] or "")]))
        lines.append("")
    if "recovery" in results:
        rows = results["recovery"]
        lines += ["## Detection and recovery after kill -9", "",
                  "Two nodes, 12 greedy requests streaming (round-robin), one node killed with "
                  "SIGKILL.  Detect: kill to the service logging the instance down.  "
                  "Recovered: for each request that was on the dead node, kill to the token "
                  "ending its longest silence after the kill; the earliest and the latest.", ""]
        lines.append(table(rows, [
            ("run", lambda r: str(r["rep"])),
            ("detect ms", lambda r: ms(r["detect_ms"])),
            ("requests moved", lambda r: str(r["victims"])),
            ("first recovered ms", lambda r: ms(r["first_recovered_ms"])),
            ("last recovered ms", lambda r: ms(r["last_recovered_ms"])),
            ("client errors", lambda r: str(r["errors"]))]))
        lines.append("")
    with open(args.report, "w") as f:
        f.write("\n".join(lines))
    print(f"cluster_bench: wrote {args.report}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--troupe", default=os.path.join(REPO, "build", "troupe"))
    ap.add_argument("--parts", default="instances,migration,recovery")
    ap.add_argument("--report", default=os.path.join(REPO, "docs", "bench_cluster.md"))
    ap.add_argument("--json-out", help="also write the raw rows as JSON")
    args = ap.parse_args()
    if not os.access(args.troupe, os.X_OK):
        die(f"no troupe binary at {args.troupe} (build first)")
    parts = {"instances": part_instances, "migration": part_migration,
             "recovery": part_recovery, "handoff": part_handoff, "copies": part_copies}
    secret = secret_file()
    results = {}
    try:
        for p in args.parts.split(","):
            if p not in parts:
                die(f"unknown part '{p}' (instances, migration, recovery, handoff, copies)")
            results[p] = parts[p](args, secret)
    finally:
        os.unlink(secret)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=2)
    report(args, results)


if __name__ == "__main__":
    main()
