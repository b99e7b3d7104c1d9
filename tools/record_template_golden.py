#!/usr/bin/env python3
"""Records llama.cpp's renderings of real chat templates (tests/data/chat_template_golden.json).

Run once, by hand, with a llama.cpp built elsewhere (docs/peer_llamacpp.md)
and its models/templates folder; the tests then run troupe's Jinja
interpreter on the same templates and conversations and compare:

  python3 tools/record_template_golden.py --llama-bin /path/to/llama.cpp/build/bin \\
      --templates /path/to/llama.cpp/models/templates \\
      --model ~/.cache/troupe/models/moe/moe-4x2-f32.gguf \\
      -o tests/data/chat_template_golden.json

For each template: its text (the tests need it), the BOS and EOS text
llama-server gave it (/props), and for each conversation the prompt
llama-server's /apply-template rendered (--jinja, generation prompt on).
Templates that read the clock (strftime_now) are left out: their output
depends on the day.
"""
import argparse
import json
import os
import sys
import time
import urllib.request

from record_moe_golden import llama_server  # same folder

TEMPLATES = [
    "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.3-70B-Instruct",
    "Qwen-Qwen3-0.6B",
    "Qwen-Qwen2.5-7B-Instruct",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "microsoft-Phi-3.5-mini-instruct",
    "mistralai-Mistral-Nemo-Instruct-2407",
    "HuggingFaceTB-SmolLM3-3B",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "google-gemma-2-2b-it",
    "moonshotai-Kimi-K2",
    "CohereForAI-c4ai-command-r-plus-tool_use",
    "tencent-Hy3",  # str.format
    "ByteDance-Seed-OSS",  # integer dictionary keys
    "fireworks-ai-llama-3-firefunction-v2",  # functions and datetime from the context
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "You answer briefly.\nNo lists."},
     {"role": "user", "content": "  What is 2+2?  "},
     {"role": "assistant", "content": "4, as \"four\"."},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a {joke} with 'quotes'."}],
]


def call(port, path, body=None):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path),
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:  # a template's raise_exception
        return {"error": json.loads(e.read()).get("error", {}).get("message", str(e))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--templates", required=True, help="llama.cpp's models/templates folder")
    ap.add_argument("--model", required=True, help="any small GGUF for llama-server to load")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="record these templates only, keeping the file's other entries")
    args = ap.parse_args()
    out = {}
    names = TEMPLATES
    if args.only:
        unknown = [n for n in args.only if n not in TEMPLATES]
        if unknown:
            ap.error("not in TEMPLATES: " + ", ".join(unknown))
        names = args.only
        if os.path.exists(args.out):
            with open(args.out, encoding="utf-8") as f:
                out = json.load(f)
    for name in names:
        path = os.path.join(args.templates, name + ".jinja")
        with open(path, encoding="utf-8") as f:
            source = f.read()
        if "strftime_now" in source:
            print("[template] %s: reads the clock, left out" % name, file=sys.stderr)
            continue
        print("[template] %s" % name, file=sys.stderr)
        with llama_server(args.llama_bin, args.model,
                          ["-c", "256", "--jinja", "--chat-template-file", path]) as port:
            props = call(port, "/props")
            rendered = []
            for messages in CONVERSATIONS:
                r = call(port, "/apply-template", {"messages": messages})
                rendered.append({"messages": messages, "prompt": r.get("prompt"),
                                 "error": r.get("error")})
        # llama.cpp gives templates today's date as date_string (Llama 3.1's
        # "Today Date") and datetime (FireFunction v2's); the tests pass the
        # recording day's.
        out[name] = {"source": source, "bos_token": props.get("bos_token", ""),
                     "eos_token": props.get("eos_token", ""),
                     "date_string": time.strftime("%d %b %Y"),
                     "datetime": time.strftime("%b %d %Y"), "conversations": rendered}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
