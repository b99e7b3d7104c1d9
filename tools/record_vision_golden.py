#!/usr/bin/env python3
"""Records llama.cpp's answers on the vision fixture (tests/data/vision_golden.json).

Run once, by hand, with a llama.cpp built elsewhere (docs/peer_llamacpp.md;
llama-server must be linked with libmtmd), on the mmproj fixture and the two
test images of tools/make_vision_fixture.py next to SmolLM2-135M-Instruct:

  python3 tools/record_vision_golden.py --llama-bin /path/to/llama.cpp/build/bin \\
      --model ~/.cache/troupe/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --mmproj ~/.cache/troupe/models/vision/llava-fixture-mmproj.gguf \\
      --image tests/data/vision_pattern.png --image tests/data/vision_pattern_t.png \\
      --commit <llama.cpp commit> -o tests/data/vision_golden.json

For each image and prompt, the OpenAI-style request (a user message whose
content is the image part then the text part) sent to /v1/chat/completions
(temperature 0, 24 tokens, no prompt cache) and llama-server's answer: the
completion text and usage (prompt_tokens counts the image's positions).  The
same prompt, rendered by /apply-template with the media marker pinned to
<__media__> (LLAMA_MEDIA_MARKER), goes to /completion as
{"prompt_string", "multimodal_data"} with return_tokens and n_probs 2,
which gives the completion's token ids and at each the gap between the
log-probabilities of llama.cpp's two best candidates (null where llama-server
did not report them); its text must equal the chat completion's.  The
rendered prompt's text around the marker is tokenized as mtmd does (each
piece alone, special tokens parsed, no BOS: SmolLM2 has add_bos_token false),
so prompt_tokens - prefix - suffix is the image's position count.

Per image, the projected embeddings llama.cpp fed the text model (dumped by
libmtmd when MTMD_DEBUG_EMBEDDINGS names a file: rows of 576 F32, stored
here base64 little-endian) and how far tools/make_vision_fixture.py's numpy
re-implementation of the encoder is from them.

llama-server runs on 127.0.0.1 with -fa off (the vision encoder then does
its attention in F32; with flash attention it casts K and V to F16), one
slot, and --threads (default 2; llama.cpp's results do not depend on it, 1 is
far faster on a loaded two-core machine).  Waits are bounded and the server
is killed by its pid.
"""
import argparse
import base64
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_vision_fixture as fixture  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
from troupe_client.local_port import free_port  # noqa: E402  (no pyzmq needed)

PROMPTS = ["What is in the image?", "Describe the colours in one sentence."]
MARKER = "<__media__>"
N_PREDICT = 24
SERVER_ARGS = ["-c", "1024", "-fa", "off", "-np", "1"]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def post(port, path, body, timeout):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path),
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError("%s: HTTP %d: %s" % (path, e.code, e.read().decode()[:500])) from None


def get(port, path, timeout):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=timeout) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def llama_server(bin_dir, model, mmproj, threads, dump, log, ready_s=300):
    """A llama-server with the mmproj on a free loopback port, ready; yields the port."""
    port = free_port()
    env = dict(os.environ, LLAMA_MEDIA_MARKER=MARKER, MTMD_DEBUG_EMBEDDINGS=dump)
    cmd = [os.path.join(bin_dir, "llama-server"), "-m", model, "--mmproj", mmproj,
           "--host", "127.0.0.1", "--port", str(port), "-t", str(threads)] + SERVER_ARGS
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError("llama-server exited (%d) before it got ready" % proc.returncode)
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server did not get ready in %d s" % ready_s)
            time.sleep(0.2)
        yield port
    finally:
        proc.kill()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            print("[record] llama-server (pid %d) did not exit" % proc.pid, file=sys.stderr)


def read_dump(path):
    """MTMD_DEBUG_EMBEDDINGS's file: int32 n_tokens, int32 n_embd, then F32 rows."""
    with open(path, "rb") as f:
        data = f.read()
    n_tokens, n_embd = np.frombuffer(data[:8], dtype="<i4")
    return np.frombuffer(data[8:], dtype="<f4").reshape(int(n_tokens), int(n_embd))


def margins(probs, tokens):
    out = []
    for i, tok in enumerate(tokens):
        p = probs[i] if i < len(probs) else None
        if not p or p.get("id") != tok or len(p.get("top_logprobs", [])) < 2:
            out.append(None)
            continue
        top = p["top_logprobs"]
        out.append(round(top[0]["logprob"] - top[1]["logprob"], 4))
    return out


def messages(b64, prompt):
    return [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}},
        {"type": "text", "text": prompt}]}]


def record(args, port, dump, timeout):
    props = get(port, "/props", timeout)
    if props.get("media_marker") not in (None, MARKER):
        raise RuntimeError("the media marker is %r, not %r" % (props.get("media_marker"), MARKER))
    weights = fixture.read_weights(args.mmproj)
    cases, images = [], {}
    for image in args.image:
        name = os.path.basename(image)
        with open(image, "rb") as f:
            b64 = base64.b64encode(f.read()).decode()
        for prompt in PROMPTS:
            print("[record] %s: %s" % (name, prompt), file=sys.stderr)
            if os.path.exists(dump):
                os.remove(dump)
            msgs = messages(b64, prompt)
            chat = post(port, "/v1/chat/completions",
                        {"messages": msgs, "temperature": 0, "max_tokens": N_PREDICT,
                         "cache_prompt": False}, timeout)
            text = chat["choices"][0]["message"]["content"]
            if name not in images and os.path.exists(dump):
                e = read_dump(dump)
                ref = fixture.encode(fixture.read_png(image), weights)
                images[name] = {
                    "sha256": sha256(image),
                    "embd_rows": int(e.shape[0]), "embd_dim": int(e.shape[1]),
                    "embd_rms": round(float(np.sqrt((e.astype(np.float64) ** 2).mean())), 6),
                    "embd_row0_head": [round(float(v), 6) for v in e[0, :8]],
                    "embd_f32le_b64": base64.b64encode(e.astype("<f4").tobytes()).decode(),
                    "numpy_reference_max_abs_diff": float(np.abs(ref - e).max()),
                }
            rendered = post(port, "/apply-template", {"messages": msgs}, timeout)["prompt"]
            if rendered.count(MARKER) != 1:
                raise RuntimeError("rendered prompt without one marker: %r" % rendered)
            prefix, suffix = rendered.split(MARKER)
            tok = {}
            for part, s in (("prefix", prefix), ("suffix", suffix)):
                tok[part] = post(port, "/tokenize", {"content": s, "add_special": False,
                                                     "parse_special": True}, timeout)["tokens"]
            comp = post(port, "/completion",
                        {"prompt": {"prompt_string": rendered, "multimodal_data": [b64]},
                         "n_predict": N_PREDICT, "temperature": 0, "top_k": 1,
                         "cache_prompt": False, "return_tokens": True, "n_probs": 2}, timeout)
            if comp["content"] != text:
                raise RuntimeError("/completion and /v1/chat/completions disagree:\n%r\n%r"
                                   % (comp["content"], text))
            n_prompt = chat["usage"]["prompt_tokens"]
            cases.append({
                "image": name,
                "prompt": prompt,
                "request": {"messages": [{"role": "user", "content": [
                    {"type": "image_url",
                     "image_url": {"url": "data:image/png;base64,<%s>" % name}},
                    {"type": "text", "text": prompt}]}],
                    "temperature": 0, "max_tokens": N_PREDICT},
                "rendered_prompt": rendered,
                "prefix_token_ids": tok["prefix"],
                "suffix_token_ids": tok["suffix"],
                "image_positions": n_prompt - len(tok["prefix"]) - len(tok["suffix"]),
                "prompt_tokens": n_prompt,
                "completion_tokens": chat["usage"]["completion_tokens"],
                "finish_reason": chat["choices"][0]["finish_reason"],
                "completion": text,
                "completion_token_ids": comp["tokens"],
                "completion_tokens_evaluated": comp.get("tokens_evaluated"),
                "top2_margin": margins(comp.get("completion_probabilities", []), comp["tokens"]),
            })
    return cases, images


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", required=True, help="folder with llama-server (libmtmd)")
    ap.add_argument("--model", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--mmproj", required=True, help="tools/make_vision_fixture.py's GGUF")
    ap.add_argument("--image", action="append", required=True, help="a test PNG (repeatable)")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--commit", default="", help="the llama.cpp commit, for the record")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per HTTP request")
    ap.add_argument("--log", help="llama-server's output (default: discarded)")
    args = ap.parse_args()
    version = subprocess.run([os.path.join(args.llama_bin, "llama-server"), "--version"],
                             capture_output=True, text=True, timeout=60)
    version = " ".join(l.strip() for l in (version.stdout + version.stderr).splitlines()
                       if l.startswith(("version", "built")))
    with tempfile.TemporaryDirectory() as tmp, \
            open(args.log or os.devnull, "w") as log:
        dump = os.path.join(tmp, "embd.bin")
        with llama_server(args.llama_bin, args.model, args.mmproj, args.threads, dump, log) as port:
            cases, images = record(args, port, dump, args.timeout)
    by_prompt = {}
    for c in cases:
        by_prompt.setdefault(c["prompt"], []).append(c["completion"])
    distinct = all(len(set(v)) == len(v) for v in by_prompt.values())
    out = {
        "llama_cpp": {"commit": args.commit, "version": version},
        "server_args": SERVER_ARGS + ["-t", str(args.threads)],
        "media_marker": MARKER,
        "n_predict": N_PREDICT,
        "sha256": {os.path.basename(p): sha256(p) for p in [args.model, args.mmproj] + args.image},
        "images": images,
        "images_give_distinct_completions": distinct,
        "cases": cases,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for c in cases:
        print("[record] %s | %s | prompt_tokens %d (image %d) | %r"
              % (c["image"], c["prompt"], c["prompt_tokens"], c["image_positions"],
                 c["completion"]), file=sys.stderr)
    for name, i in images.items():
        print("[record] %s: embeddings %dx%d rms %.4f, numpy reference off by %.2g at most"
              % (name, i["embd_rows"], i["embd_dim"], i["embd_rms"],
                 i["numpy_reference_max_abs_diff"]), file=sys.stderr)
    if not distinct:
        print("[record] WARNING: two images gave the same completion for a prompt",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
