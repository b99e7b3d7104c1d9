#!/usr/bin/env python3
"""troupe serve vs llama-server under the same serving load (issue 5).

For each system in turn: start the server as a child process, wait until it
answers, run `troupe bench serve` at each request rate and then a rate sweep
(--sweep) with the same seeded workload, stop the server; finally write a
markdown report with both systems side by side.

  LLAMA_SERVER=/path/to/llama.cpp/build/bin/llama-server \\
      python3 bench/serve_vs_llamaserver.py [--rates 0.1 0.2 0.3 0.4] \\
      [--num-requests 16] [--troupe build/troupe] [--report docs/bench_serve_vs_llamaserver.md]

Workload (the issue's): SmolLM2-135M-Instruct Q4_1 (the same GGUF for both),
prompts of random token ids with lengths uniform in [64, 512], outputs
uniform in [32, 256] tokens forced with ignore-EOS, Poisson arrivals, 2
threads each (llama-server -t; PoCL's POCL_MAX_PTHREAD_COUNT for troupe).
`troupe bench serve` draws lengths uniform in [L(1-r), L(1+r)]; [64, 512]
and [32, 256] are L = 288 and L = 144 with the same r = 7/9.

--workload shared-prefix sends instead prompts that share one of a few long
prefixes (bench serve's shared-prefix dataset), where prefix reuse decides:
troupe's prefix cache against llama-server's prompt cache with --kv-unified.

Both servers get the same concurrency: llama-server -np SLOTS with a context
of SLOTS x CTX_PER_SLOT tokens, troupe --max-seqs SLOTS with a KV arena of
the same size.  This script never builds llama.cpp (docs/peer_llamacpp.md).
--dry-run prints the commands without running anything.
"""
import argparse
import datetime
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "tools", "python"))
from troupe_client.local_port import free_port  # noqa: E402  (no pyzmq needed)

# KV bytes per token of SmolLM2-135M with a half cache: 30 layers x K and V x
# 3 KV heads x 64 dims x 2 bytes.  troupe's --kv-mb is sized from it so its
# arena holds as many tokens as llama-server's context.
SMOLLM2_KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2

DEFAULT_GOODPUT = ["ttft:5000", "tpot:200"]


def die(msg):
    sys.exit(f"serve_vs_llamaserver: {msg}")


def length_spec(lo, hi, what):
    """L and r such that troupe bench serve's [floor(L(1-r)), ceil(L(1+r))] is [lo, hi]."""
    if not (1 <= lo <= hi) or (lo + hi) % 2:
        die(f"{what} range [{lo}, {hi}]: need 1 <= lo <= hi and lo + hi even")
    length = (lo + hi) // 2
    ratio = (hi - lo) / (hi + lo)
    if math.floor(length * (1 - ratio)) != lo or math.ceil(length * (1 + ratio)) != hi:
        die(f"{what} range [{lo}, {hi}] is not exact as L={length}, r={ratio!r}")
    return length, ratio


def quote(cmd, env=None):
    pre = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    return pre + " ".join(shlex.quote(str(c)) for c in cmd)


def machine_info():
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cores": os.cpu_count(), "cpu": "unknown", "kernel": os.uname().release}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                info["cpu"] = line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        info["memory"] = f"{kb / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return info


def loadavg():
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def git_commit():
    r = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def tail(path, n=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


class Server:
    """A server child process, its log, and a readiness check."""

    def __init__(self, name, cmd, env, log_path, ready):
        self.name, self.cmd, self.env, self.log_path, self.ready = name, cmd, env, log_path, ready
        self.proc = None

    def start(self, timeout):
        self.log = open(self.log_path, "w")
        env = dict(os.environ, **self.env)
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                die(f"{self.name} exited with {self.proc.returncode} before it was ready; "
                    f"log {self.log_path}:\n{tail(self.log_path)}")
            if self.ready():
                return
            time.sleep(0.5)
        self.stop()
        die(f"{self.name} not ready after {timeout} s; log {self.log_path}:\n{tail(self.log_path)}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.log.close()
        self.proc = None


def http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def troupe_ping(troupe, endpoint):
    r = subprocess.run([troupe, "client", "--server", endpoint, "ping"], capture_output=True,
                       timeout=30)
    return r.returncode == 0


def bench_cmd(args, system, endpoint, extra, json_out):
    cmd = [args.troupe, "bench", "serve"]
    if system == "llama-server":
        cmd += ["--backend", "openai", "--base-url", endpoint]
    else:
        cmd += ["--backend", "troupe", "--server", endpoint]
    if args.workload == "random":
        cmd += ["--dataset-name", "random",
                "--random-input-len", str(args.in_len), "--random-output-len", str(args.out_len),
                "--random-range-ratio", repr(args.ratio)]
    else:
        cmd += ["--dataset-name", "shared-prefix",
                "--prefix-repetition-num-prefixes", str(args.prefix_groups),
                "--prefix-repetition-prefix-len", str(args.prefix_len),
                "--prefix-repetition-suffix-len", str(args.suffix_len),
                "--prefix-repetition-output-len", str(args.prefix_output_len)]
    cmd += ["--ignore-eos", "--burstiness", "1",
            "--seed", str(args.seed), "--request-timeout", str(args.request_timeout),
            "--goodput", *args.goodput, "--no-progress"]
    return cmd + extra + ["--json-out", json_out]


def run_bench(cmd, out_path, dry):
    print("+ " + quote(cmd), file=sys.stderr, flush=True)
    if dry:
        return None
    with open(out_path, "w") as out:
        # stderr (the per-probe progress lines) stays on the terminal.
        r = subprocess.run(cmd, stdout=out)
    with open(out_path) as f:
        sys.stderr.write(f.read())
    json_path = cmd[cmd.index("--json-out") + 1]
    if r.returncode != 0 and not os.path.exists(json_path):
        return {"error": f"exit status {r.returncode}, no result"}
    with open(json_path) as f:
        res = json.load(f)
    if r.returncode != 0:
        res["exit_status"] = r.returncode
    return res


def run_system(args, system, results_dir, dry):
    port = free_port() if not dry else (18080 if system == "llama-server" else 15555)
    n_ctx = args.slots * args.ctx_per_slot
    if system == "llama-server":
        endpoint = f"http://127.0.0.1:{port}"
        cmd = [args.llama_server, "-m", args.model, "-t", str(args.threads), "-c", str(n_ctx),
               "-np", str(args.slots), "--host", "127.0.0.1", "--port", str(port)]
        if not args.llama_no_fa:
            cmd += ["-fa", "on"]
        if not args.llama_no_kvu:
            cmd.append("--kv-unified")
        cmd += args.llama_arg
        env = {}
        ready = lambda: http_ok(endpoint + "/health")
    else:
        endpoint = f"tcp://127.0.0.1:{port}"
        kv_mb = args.kv_mb or math.ceil(n_ctx * SMOLLM2_KV_BYTES_PER_TOKEN / 2**20)
        cmd = [args.troupe, "serve", "--model", args.model, "--listen", endpoint,
               "--max-seqs", str(args.slots), "--kv-mb", str(kv_mb)]
        cmd += args.troupe_arg
        env = {"POCL_MAX_PTHREAD_COUNT": str(args.threads)}
        ready = lambda: troupe_ping(args.troupe, endpoint)
    rec = {"system": system, "server_cmd": quote(cmd, env), "rates": {}, "bench_cmds": []}
    print(f"== {system}: {quote(cmd, env)}", file=sys.stderr, flush=True)
    server = Server(system, cmd, env, os.path.join(results_dir, f"{system}.log"), ready)
    tag = system.replace("-", "_")
    rec["load_before"] = loadavg()
    try:
        if not dry:
            server.start(args.start_timeout)
        # Warm-up: different prompts (another seed), not recorded.
        warm = bench_cmd(args, system, endpoint, ["--num-requests", "2", "--request-rate", "inf"],
                         os.path.join(results_dir, f"{tag}_warmup.json"))
        warm[warm.index("--seed") + 1] = str(args.seed + 1000)
        rec["warmup_cmd"] = quote(warm)
        run_bench(warm, os.path.join(results_dir, f"{tag}_warmup.txt"), dry)
        for i, rate in enumerate(args.rates):
            cmd_b = bench_cmd(args, system, endpoint,
                              ["--num-requests", str(args.num_requests), "--request-rate",
                               repr(rate)],
                              os.path.join(results_dir, f"{tag}_rate_{rate}.json"))
            # Each rate's own prompts (salt i: the same sizes, other token
            # ids): a prompt cache must not answer one rate's prefills
            # with an earlier rate's.
            cmd_b += ["--prompt-salt", str(i)]
            rec["bench_cmds"].append(quote(cmd_b))
            rec["rates"][rate] = run_bench(cmd_b, os.path.join(results_dir, f"{tag}_rate_{rate}.txt"),
                                           dry)
        if not args.no_sweep:
            cmd_s = bench_cmd(args, system, endpoint,
                              ["--num-requests", str(args.sweep_num_requests or args.num_requests),
                               "--sweep", "--goodput-target", repr(args.goodput_target),
                               "--sweep-start", repr(args.sweep_start),
                               "--sweep-max", repr(args.sweep_max),
                               "--sweep-steps", str(args.sweep_steps),
                               "--sweep-precision", repr(args.sweep_precision)],
                              os.path.join(results_dir, f"{tag}_sweep.json"))
            # Probe k's prompts are salt 100 + k - 1's (bench serve's
            # default), past the fixed rates' salts.
            cmd_s += ["--prompt-salt", "100"]
            rec["sweep_cmd"] = quote(cmd_s)
            rec["sweep"] = run_bench(cmd_s, os.path.join(results_dir, f"{tag}_sweep.txt"), dry)
    finally:
        server.stop()
    rec["load_after"] = loadavg()
    return rec


# ---- the report ----

def fmt(v, nd=2):
    if v is None:
        return "–"
    if isinstance(v, str):
        return v
    return f"{v:.{nd}f}"


def ratio(a, b):
    if a is None or b is None or isinstance(a, str) or isinstance(b, str) or b == 0:
        return "–"
    return f"{a / b:.2f}"


def rate_rows(res):
    """(label, value, decimals) of one run's result."""
    if res is None or "error" in res and "num_requests" not in res:
        return None
    sent = res.get("num_requests", 0)
    good = res.get("good_completed", 0)
    errs = ", ".join(f"{k} {v}" for k, v in sorted(res.get("errors", {}).items())) or "0"
    return [
        ("completed / sent", f"{res.get('completed', 0)} / {sent}", 0),
        ("throughput (req/s)", res.get("request_throughput"), 3),
        ("output tokens/s", res.get("output_throughput"), 1),
        ("TTFT p50 (ms)", res["ttft_ms"]["median"], 0),
        ("TTFT p99 (ms)", res["ttft_ms"]["p99"], 0),
        ("TPOT p50 (ms)", res["tpot_ms"]["median"], 1),
        ("TPOT p99 (ms)", res["tpot_ms"]["p99"], 1),
        ("goodput (req/s)", res.get("request_goodput"), 3),
        ("goodput (fraction of sent)", good / sent if sent else None, 2),
        ("errors", errs, 0),
        ("duration (s)", res.get("duration_s"), 0),
    ]


def write_report(args, recs, info, path):
    by = {r["system"]: r for r in recs}
    llama, troupe = by.get("llama-server"), by.get("troupe")
    L = []
    w = L.append
    w("# Serving: troupe vs llama-server (SmolLM2-135M-Instruct"
      + (", shared-prefix workload" if args.workload == "shared-prefix" else "") + ")\n")
    w("Written by `bench/serve_vs_llamaserver.py`; regenerate with the command at the end. "
      "Both systems were loaded by the same tool (`troupe bench serve`; the OpenAI backend for "
      "llama-server's `/v1/completions`) with the same seeded workload, one system after the "
      "other.\n")
    w("## Machine\n")
    w(f"- date: {info['date']}; troupe {info['commit']}; llama-server `{info['llama_version']}`")
    w(f"- CPU: {info['cpu']}, {info['cores']} cores visible, {info.get('memory', '?')} memory, "
      f"Linux {info['kernel']}")
    for r in recs:
        w(f"- load average (1/5/15 min) around {r['system']}: before {r['load_before']}, "
          f"after {r['load_after']}")
    w("")
    w("## Workload\n")
    w(f"- model: `{os.path.basename(args.model)}` (the same file for both)")
    if args.workload == "random":
        w(f"- {args.num_requests} requests per rate; prompts of random token ids, lengths uniform "
          f"in [{args.input_range[0]}, {args.input_range[1]}]; outputs uniform in "
          f"[{args.output_range[0]}, {args.output_range[1]}] tokens with ignore-EOS; Poisson "
          f"arrivals; seed {args.seed}: the same lengths and arrival gaps (scaled by 1/rate) for "
          "both systems, every rate and every probe; the token ids of prompt salts 0, 1, ... for "
          "the fixed rates in order and 100, 101, ... for the sweep's probes (`--prompt-salt`), "
          "so neither system's prompt cache answers a run with an earlier run's prefills)")
    else:
        w(f"- {args.num_requests} requests per rate; shared prefixes: {args.prefix_groups} groups, "
          f"each prompt a group's {args.prefix_len} random tokens then {args.suffix_len} of its "
          f"own; {args.prefix_output_len} output tokens with ignore-EOS; Poisson arrivals; seed "
          f"{args.seed} (the same arrival gaps, scaled by 1/rate, everywhere) with prompt salts "
          "0, 1, ... for the fixed rates and 100, 101, ... for the sweep's probes (the same prompts "
          "for both systems; new prefixes for every rate and probe, so reuse happens within a "
          "run). Prefix reuse on in both: "
          "troupe's prefix cache (on by "
          "default), llama-server's prompt cache (on by default) with `--kv-unified` (one KV "
          "buffer for all slots, so a prefix computed in one slot serves the others)")
    w(f"- {args.threads} threads each; concurrency: llama-server `-np {args.slots}` with a "
      f"context of {args.slots * args.ctx_per_slot} tokens"
      + (" (one unified KV buffer: any slot may use all of it)" if not args.llama_no_kvu else
         f" ({args.ctx_per_slot} per slot)")
      + f"; troupe `--max-seqs {args.slots}` with a KV arena of the same token capacity; other "
      "settings default")
    w(f"- SLOs for goodput: `{' '.join(args.goodput)}` (ms)"
      + (". Why these: on an idle server here both systems prefill the longest prompt "
         "(512 tokens) in 2-3 s, so a TTFT of 5 s leaves about 2x headroom and a miss means "
         "queueing or interference, not base speed; single-stream decode takes about 7-14 ms/token "
         "on both (bench/engine_vs_llamacpp.py, SmolLM2 tg128), so a TPOT of 200 ms (5 tokens/s) leaves room "
         "for batching and for decode steps stalled by other requests' prefills, and is still "
         "far below what a reader needs to keep up"
         if args.goodput == DEFAULT_GOODPUT and args.workload == "random" else ""))
    w(f"- goodput fraction = requests sent that completed within every SLO / requests sent "
      "(failures count against it)\n")
    w("## Commands\n")
    w("```")
    for r in recs:
        w(f"# {r['system']}")
        w(r["server_cmd"])
        w(r["warmup_cmd"] + "   # warm-up, not recorded")
        for c in r["bench_cmds"]:
            w(c)
        if r.get("sweep_cmd"):
            w(r["sweep_cmd"])
    w("```\n")
    w("## Fixed rates\n")
    w("Ratios are troupe / llama-server: above 1 is better for throughput and goodput, worse "
      "for TTFT and TPOT. Times in ms; TTFT and TPOT over completed requests.\n")
    for rate in args.rates:
        w(f"### {rate} req/s\n")
        a = rate_rows(llama["rates"].get(rate)) if llama else None
        b = rate_rows(troupe["rates"].get(rate)) if troupe else None
        w("| metric | llama-server | troupe | troupe / llama |")
        w("|---|---:|---:|---:|")
        rows = a or b or []
        for i, (label, _, nd) in enumerate(rows):
            va = a[i][1] if a else None
            vb = b[i][1] if b else None
            rt = ratio(vb, va) if label not in ("errors", "duration (s)") else ""
            w(f"| {label} | {fmt(va, nd)} | {fmt(vb, nd)} | {rt} |")
        if not rows:
            w("| (no result) | | | |")
        w("")
    if not args.no_sweep:
        w("## Rate sweep\n")
        w(f"Highest request rate at which at least {args.goodput_target:g} of the requests sent "
          f"finish within `{' '.join(args.goodput)}`: start {args.sweep_start:g} req/s, doubling "
          f"while the target holds, then geometric bisection until the bracket is within "
          f"{args.sweep_precision:g} (relative), at most {args.sweep_steps} probes of "
          f"{args.sweep_num_requests or args.num_requests} requests each.\n")
        w("| system | highest rate meeting the target (req/s) |")
        w("|---|---:|")
        for r in recs:
            s = r.get("sweep") or {}
            best = (s.get("sweep") or {}).get("highest_rate")
            w(f"| {r['system']} | {fmt(best, 3) if best is not None else 'none'} |")
        a_best = ((llama or {}).get("sweep") or {}).get("sweep", {}).get("highest_rate")
        b_best = ((troupe or {}).get("sweep") or {}).get("sweep", {}).get("highest_rate")
        w(f"| troupe / llama-server | {ratio(b_best, a_best)} |\n")
        for r in recs:
            probes = ((r.get("sweep") or {}).get("probes")) or []
            w(f"{r['system']} probes:\n")
            w("| rate (req/s) | goodput fraction | result | req/s | output tok/s | TTFT p50 | "
              "TTFT p99 | TPOT p50 | TPOT p99 | errors |")
            w("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
            for p in probes:
                w(f"| {p['request_rate']:.4g} | {p['goodput_fraction']:.2f} | "
                  f"{'pass' if p['pass'] else 'fail'} | {p['request_throughput']:.3f} | "
                  f"{p['output_throughput']:.1f} | {p['ttft_ms']['median']:.0f} | "
                  f"{p['ttft_ms']['p99']:.0f} | {p['tpot_ms']['median']:.1f} | "
                  f"{p['tpot_ms']['p99']:.1f} | {p['failed']} |")
            w("")
    w("## Reproduce\n")
    w("```")
    w(info["script_cmd"])
    w("```")
    w(f"\nRaw results (JSON per run, server logs): `{args.results_dir}` (not committed).")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def main():
    model_dir = os.environ.get("TROUPE_MODEL_DIR", os.path.expanduser("~/.cache/troupe/models"))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"),
                    help="llama-server binary (default: $LLAMA_SERVER; required)")
    ap.add_argument("--troupe", default=os.environ.get("TROUPE", os.path.join(REPO, "build", "troupe")),
                    help="troupe binary (default: $TROUPE or build/troupe)")
    ap.add_argument("--model", default=os.path.join(model_dir, "SmolLM2-135M-Instruct.Q4_1.gguf"),
                    help="GGUF both servers load (default: SmolLM2 Q4_1 in $TROUPE_MODEL_DIR or "
                         "~/.cache/troupe/models)")
    ap.add_argument("--systems", nargs="+", default=["llama-server", "troupe"],
                    choices=["llama-server", "troupe"], help="which to run, in this order")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=4,
                    help="llama-server -np and troupe --max-seqs")
    ap.add_argument("--ctx-per-slot", type=int, default=1024,
                    help="tokens per sequence: llama-server -c is SLOTS x this")
    ap.add_argument("--kv-mb", type=int, default=0,
                    help="troupe --kv-mb (default: SLOTS x CTX_PER_SLOT tokens of SmolLM2's half KV)")
    ap.add_argument("--rates", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.4],
                    help="request rates (req/s) of the fixed-rate runs")
    ap.add_argument("--num-requests", type=int, default=16, help="requests per rate")
    ap.add_argument("--input-range", type=int, nargs=2, default=[64, 512], metavar=("LO", "HI"))
    ap.add_argument("--output-range", type=int, nargs=2, default=[32, 256], metavar=("LO", "HI"))
    ap.add_argument("--workload", choices=["random", "shared-prefix"], default="random",
                    help="random: random prompts of --input-range tokens; shared-prefix: "
                         "--prefix-groups prefixes of --prefix-len tokens, each prompt one of them "
                         "then --suffix-len tokens of its own")
    ap.add_argument("--prefix-groups", type=int, default=4)
    ap.add_argument("--prefix-len", type=int, default=512)
    ap.add_argument("--suffix-len", type=int, default=64)
    ap.add_argument("--prefix-output-len", type=int, default=128)
    ap.add_argument("--goodput", nargs="+", default=DEFAULT_GOODPUT,
                    help="SLOs in ms (troupe bench serve --goodput)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--request-timeout", type=float, default=600,
                    help="seconds of silence before a request fails (queued requests are silent)")
    ap.add_argument("--no-sweep", action="store_true", help="fixed rates only")
    ap.add_argument("--goodput-target", type=float, default=0.9)
    ap.add_argument("--sweep-start", type=float, default=0.1)
    ap.add_argument("--sweep-max", type=float, default=0, help="0: no cap")
    ap.add_argument("--sweep-steps", type=int, default=4)
    ap.add_argument("--sweep-precision", type=float, default=0.25)
    ap.add_argument("--sweep-num-requests", type=int, default=12,
                    help="requests per sweep probe (0: --num-requests)")
    ap.add_argument("--llama-arg", action="append", default=[],
                    help="extra llama-server argument (repeatable; use --llama-arg=-X for dashes)")
    ap.add_argument("--llama-no-fa", action="store_true",
                    help="run llama-server without `-fa on` (flash attention, on by default: its "
                         "faster setting here, 0.62 vs 0.55 req/s in a closed loop of 4; llama.cpp "
                         "builds from before mid-2025 take a bare -fa: pass --llama-no-fa "
                         "--llama-arg=-fa for those)")
    ap.add_argument("--llama-no-kvu", action="store_true",
                    help="run llama-server without --kv-unified (on by default: one KV buffer for "
                         "all slots, so its prompt cache serves a prefix across slots)")
    ap.add_argument("--troupe-arg", action="append", default=[],
                    help="extra troupe serve argument (repeatable)")
    ap.add_argument("--start-timeout", type=float, default=180, help="seconds a server gets to start")
    ap.add_argument("--results-dir", default=None,
                    help="JSON results and server logs (default: build/serve_vs_llamaserver-STAMP)")
    ap.add_argument("--report", default=None,
                    help="markdown report (default: docs/bench_serve_vs_llamaserver.md, or "
                         "..._shared_prefix.md for --workload shared-prefix)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args()
    if not args.report:
        name = ("bench_serve_vs_llamaserver.md" if args.workload == "random"
                else "bench_serve_vs_llamaserver_shared_prefix.md")
        args.report = os.path.join(REPO, "docs", name)

    if not args.llama_server and "llama-server" in args.systems:
        die("set LLAMA_SERVER (or --llama-server) to an existing llama-server binary; "
            "this script never builds llama.cpp")
    if args.llama_server and not args.dry_run and not os.access(args.llama_server, os.X_OK):
        die(f"{args.llama_server}: not an executable")
    if not args.dry_run:
        if not os.access(args.troupe, os.X_OK):
            die(f"{args.troupe}: not an executable (build troupe first, or pass --troupe)")
        if not os.path.isfile(args.model):
            die(f"{args.model}: no such model file (tools/setup.sh fetches it)")
    args.in_len, r_in = length_spec(*args.input_range, "input")
    args.out_len, r_out = length_spec(*args.output_range, "output")
    if r_in != r_out:
        die(f"input and output ranges need the same relative width (troupe bench serve has one "
            f"--random-range-ratio): {r_in!r} vs {r_out!r}")
    args.ratio = r_in
    longest = (max(args.input_range) + max(args.output_range) if args.workload == "random"
               else args.prefix_len + args.suffix_len + args.prefix_output_len)
    if longest > args.ctx_per_slot:
        die("--ctx-per-slot is smaller than the longest prompt plus output")
    if not args.results_dir:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        args.results_dir = os.path.join(REPO, "build", f"serve_vs_llamaserver-{stamp}")
    if not args.dry_run:
        os.makedirs(args.results_dir, exist_ok=True)

    info = machine_info()
    info["commit"] = git_commit()
    info["llama_version"] = "?"
    if args.llama_server and not args.dry_run:
        r = subprocess.run([args.llama_server, "--version"], capture_output=True, text=True)
        info["llama_version"] = " ".join((r.stdout + r.stderr).split())[:200]
    info["script_cmd"] = quote(["python3", "bench/serve_vs_llamaserver.py"] + sys.argv[1:],
                               {"LLAMA_SERVER": "/path/to/llama-server"})
    recs = [run_system(args, s, args.results_dir, args.dry_run) for s in args.systems]
    if args.dry_run:
        return
    with open(os.path.join(args.results_dir, "summary.json"), "w") as f:
        json.dump({"machine": info, "systems": recs}, f, indent=1, default=str)
    write_report(args, recs, info, args.report)
    print(f"report: {args.report}; raw results: {args.results_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
