#!/usr/bin/env python3
"""Streams one answer from a running `troupe serve`, then runs a few prompts
at once with the asyncio client.

    troupe serve -m stories15m --listen tcp://127.0.0.1:5555 &
    python3 tools/python/examples/generate.py tcp://127.0.0.1:5555 "Once upon a time"
"""
import asyncio
import sys

from troupe_client import AsyncClient, Client


def main() -> None:
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
    prompt = sys.argv[2] if len(sys.argv) > 2 else "Once upon a time"
    with Client(endpoint) as cl:
        pong = cl.ping()
        print(f"server model {pong.model}, protocol {pong.protocol_version}, {pong.rtt_ms:.2f} ms")
        stream = cl.generate(prompt, max_tokens=48)
        print(prompt, end="")
        for chunk in stream:
            print(chunk.text, end="", flush=True)
        r = stream.result
        print(f"\n[{r.finish_reason}: {r.completion_tokens} tokens, ttft {r.ttft_ms:.1f} ms, tpot {r.tpot_ms:.1f} ms]")

    async def several() -> None:
        async with AsyncClient(endpoint) as acl:
            prompts = ["The cat", "A little boy", "The sun was"]
            results = await asyncio.gather(*(acl.generate(p, max_tokens=16, stream=False) for p in prompts))
            for p, r in zip(prompts, results):
                print(f"{p!r} -> {r.text!r} ({r.finish_reason})")

    asyncio.run(several())


if __name__ == "__main__":
    main()
