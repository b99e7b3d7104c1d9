#!/usr/bin/env python3
"""Many concurrent streaming chats through the OpenAI HTTP API (AsyncOpenAI)
against the same load through troupe's ZeroMQ protocol (troupe_client.aio),
on one `troupe serve`, with /health polled throughout (issue 34).

    build/py-venv/bin/python bench/openai_streams.py --streams 256 --max-tokens 32

Starts the server itself (loopback, ports the OS picks), runs the ZeroMQ
round and the HTTP round alternately (--rounds), and prints per round:
requests done, TTFT p50/p99 (first content), wall time, output tokens/s,
and /health's worst latency.  The figures go to docs/bench_openai.md by
hand, with this command.
"""

import argparse
import asyncio
import os
import pathlib
import select
import subprocess
import sys
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "python"))

import openai  # noqa: E402
from troupe_client.aio import AsyncClient  # noqa: E402
from troupe_client.local_port import free_port  # noqa: E402

PROMPTS = ["Tell me a story about a dragon.", "Why is the sky blue?", "Name three fruits.",
           "Write a haiku about the sea.", "What is a computer?", "Describe a cat."]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


async def health_watch(base: str, stop: asyncio.Event, worst: list):
    loop = asyncio.get_running_loop()

    def one():
        t0 = time.monotonic()
        with urllib.request.urlopen(base + "/health", timeout=30) as r:
            r.read()
        return time.monotonic() - t0

    while not stop.is_set():
        worst[0] = max(worst[0], await loop.run_in_executor(None, one))
        await asyncio.sleep(0.2)


async def http_round(base: str, model: str, n: int, max_tokens: int):
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=600)
    ttft, tokens, errors = [], 0, 0

    async def one(i):
        nonlocal tokens, errors
        t0 = time.monotonic()
        first = None
        try:
            stream = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                max_tokens=max_tokens, temperature=0.7, seed=i, stream=True,
                stream_options={"include_usage": True})
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.monotonic() - t0
                if chunk.usage:
                    tokens += chunk.usage.completion_tokens
        except openai.APIError:
            errors += 1
            return
        if first is not None:
            ttft.append(first)

    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    await client.close()
    return ttft, tokens, errors, time.monotonic() - t0


async def zmq_round(endpoint: str, n: int, max_tokens: int):
    ttft, tokens, errors = [], 0, 0
    async with AsyncClient(endpoint, timeout=600) as cl:
        async def one(i):
            nonlocal tokens, errors
            t0 = time.monotonic()
            first = None
            try:
                s = await cl.generate([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                      max_tokens=max_tokens, temperature=0.7, seed=i)
                async for chunk in s:
                    if first is None and chunk.text:
                        first = time.monotonic() - t0
                r = await s.wait()
                tokens += r.completion_tokens
            except Exception:  # noqa: BLE001 (a refusal counts as an error)
                errors += 1
                return
            if first is not None:
                ttft.append(first)

        t0 = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(n)))
    return ttft, tokens, errors, time.monotonic() - t0


async def main_async(a, base, endpoint):
    for rnd in range(a.rounds):
        for name in ("zeromq", "http"):
            stop, worst = asyncio.Event(), [0.0]
            watch = asyncio.create_task(health_watch(base, stop, worst))
            if name == "http":
                ttft, tokens, errors, wall = await http_round(base, a.model, a.streams, a.max_tokens)
            else:
                ttft, tokens, errors, wall = await zmq_round(endpoint, a.streams, a.max_tokens)
            stop.set()
            await watch
            print(f"round {rnd + 1} {name:6s}: {len(ttft)}/{a.streams} streams, {errors} errors, "
                  f"TTFT p50 {pct(ttft, 50) * 1000:.0f} ms p99 {pct(ttft, 99) * 1000:.0f} ms, "
                  f"{tokens / wall:.1f} output tok/s over {wall:.1f} s, "
                  f"/health worst {worst[0] * 1000:.0f} ms", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--troupe", default=str(REPO / "build" / "troupe"))
    p.add_argument("--troupe-arg", action="append", default=[])
    a = p.parse_args()
    port = free_port()
    srv = subprocess.Popen([a.troupe, "serve", "-m", a.model, "--listen", "tcp://127.0.0.1:*",
                            "--http-port", str(port), "--max-queue", "4096", *a.troupe_arg],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        line = b""
        until = time.monotonic() + 120
        while b"http on" not in line and time.monotonic() < until:
            if select.select([srv.stdout], [], [], 0.5)[0]:
                chunk = os.read(srv.stdout.fileno(), 4096)
                if not chunk:
                    break
                line += chunk
        text = line.decode()
        endpoint = text.split("listening on ")[1].split()[0]
        print(f"troupe serve {a.model}: {a.streams} concurrent streams of {a.max_tokens} tokens, "
              f"{a.rounds} rounds", flush=True)
        asyncio.run(main_async(a, f"http://127.0.0.1:{port}", endpoint))
    finally:
        srv.terminate()
        srv.wait(timeout=30)


if __name__ == "__main__":
    main()
