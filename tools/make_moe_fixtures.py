#!/usr/bin/env python3
"""Writes the mixture-of-experts GGUF fixtures the tests run (issue 15).

No small trained MoE model can be fetched here, so the MoE tests rest on
files with seeded random weights in the llama-family layout that llama.cpp
reads (llama.expert_count, llama.expert_used_count, ffn_gate_inp,
ffn_{gate,up,down}_exps), for which llama.cpp's greedy tokens and perplexity
were recorded once (tests/data/moe_golden.json, by
tools/record_moe_golden.py).  The weights are made here by the test set-up,
never committed; every file's sha256 is checked against the recorded one, so
a fixture that came out different (another gguf or numpy) fails loudly
instead of comparing against figures of other weights.

The weights come from a counter-based hash (splitmix64 of the tensor's name
and the element index), not from numpy's generators, so that they do not
depend on numpy's version.  The vocabulary is the first N pieces of the
stories15M SentencePiece tokenizer (tokenizer.bin from the model cache, its
byte pieces named <0xNN> and its spaces written as the word marker, as GGUF
wants them).

  python3 tools/make_moe_fixtures.py --tokenizer ~/.cache/troupe/models/tokenizer.bin \\
      --out ~/.cache/troupe/models/moe [--golden tests/data/moe_golden.json]

Needs the PyPI packages gguf (0.19) and numpy.
"""
import argparse
import hashlib
import json
import os
import struct
import sys

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as Q
except ImportError:  # pragma: no cover - a message instead of a trace
    sys.exit("make_moe_fixtures.py needs the PyPI package gguf (pip install gguf==0.19.0)")

# The fixtures.  `skew` > 0 gives every token embedding a shared direction
# and the router rows of experts 0 and 1 a component along it, so that the
# router favours them (the expert controller's test load).
FIXTURES = {
    "moe-4x2-f32": dict(
        n_embd=64, n_ff=128, n_layer=2, n_head=4, n_head_kv=2, n_expert=4, n_used=2,
        n_vocab=2048, seed=1, skew=0.0,
        types=dict(embd=Q.F32, attn=Q.F32, gate_up=Q.F32, down=Q.F32, output=Q.F32)),
    "moe-8x2-q": dict(
        n_embd=128, n_ff=256, n_layer=3, n_head=4, n_head_kv=2, n_expert=8, n_used=2,
        n_vocab=4096, seed=2, skew=0.0,
        types=dict(embd=Q.Q8_0, attn=Q.Q8_0, gate_up=Q.Q4_0, down=Q.Q4_1, output=Q.Q8_0)),
    "moe-8x2-skew": dict(
        n_embd=128, n_ff=256, n_layer=3, n_head=4, n_head_kv=2, n_expert=8, n_used=2,
        n_vocab=4096, seed=3, skew=1.5,
        types=dict(embd=Q.F32, attn=Q.F16, gate_up=Q.F16, down=Q.F16, output=Q.F16)),
    # Qwen2-MoE's layout: biased Q/K/V projections, NeoX rotation, routed
    # experts narrower than the shared expert every token runs (its output
    # scaled by a sigmoid gate), top-k weights not renormalised.
    "qwen2moe-4x2-shared": dict(
        arch="qwen2moe", n_embd=128, n_ff=128, n_ff_shared=256, n_layer=2, n_head=4, n_head_kv=2,
        n_expert=4, n_used=2, n_vocab=2048, seed=15, skew=0.0,
        types=dict(embd=Q.Q8_0, attn=Q.Q8_0, gate_up=Q.Q4_1, down=Q.Q8_0, output=Q.F16,
                   shared_gate_up=Q.Q8_0, shared_down=Q.F16)),
    # Not a mixture: Qwen 3's dense layout (issue 33), here because the
    # fixture machinery is the same.  Per-head RMSNorm of q and k
    # (attn_q_norm, attn_k_norm) before the NeoX rotation, no biases, and a
    # head size (64) that is not n_embd / n_head (32), as Qwen 3's files
    # have.  (gguf-py cannot write K-quants; the Gemma 3 file covers them.)
    "qwen3-dense": dict(
        arch="qwen3", n_embd=128, n_ff=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64,
        n_expert=0, n_used=0, n_vocab=2048, seed=33, skew=0.0,
        types=dict(embd=Q.Q8_0, attn=Q.Q8_0, gate_up=Q.F16, down=Q.Q8_0, output=Q.F16)),
}

CONTEXT_LENGTH = 256
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def fnv1a64(text):
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def uniform(name, seed, n):
    """n values uniform in [-1, 1) from splitmix64 of (name, seed, index)."""
    base = np.uint64((fnv1a64(name) ^ (seed * 0x9E3779B97F4A7C15)) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        z = base + (np.arange(n, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(40)).astype(np.float64) / float(1 << 23) - 1.0).astype(np.float32)


def read_llama2c_tokenizer(path, n_vocab):
    """The first n_vocab pieces of a llama2.c tokenizer.bin, GGUF-style."""
    with open(path, "rb") as f:
        data = f.read()
    at = 4  # max_token_length
    tokens, scores, types = [], [], []
    for i in range(n_vocab):
        score, length = struct.unpack_from("<fi", data, at)
        at += 8
        piece = data[at:at + length]
        at += length
        if i == 0:
            text, kind = "<unk>", 2
        elif i in (1, 2):
            text, kind = ("<s>", "</s>")[i - 1], 3
        elif 3 <= i <= 258:  # the early export stores byte pieces raw
            text, kind = "<0x%02X>" % (i - 3), 6
        else:
            # llama2.c writes SentencePiece's word marker as a space.
            text, kind = piece.decode("utf-8").replace(" ", "\u2581"), 1
        tokens.append(text)
        scores.append(score)
        types.append(kind)
    return tokens, scores, types


def as_type(values, qtype):
    if qtype == Q.F32:
        return values.astype(np.float32), None
    if qtype == Q.F16:
        return values.astype(np.float16), None
    return gguf.quants.quantize(values.astype(np.float32), qtype), qtype


def build(name, spec, tokenizer, out_dir):
    D, F, L = spec["n_embd"], spec["n_ff"], spec["n_layer"]
    H, HKV, E = spec["n_head"], spec["n_head_kv"], spec["n_expert"]
    V, seed, skew = spec["n_vocab"], spec["seed"], spec["skew"]
    hd = spec.get("head_dim", D // H)
    types = spec["types"]
    path = os.path.join(out_dir, name + ".gguf")
    tmp = path + ".tmp"
    arch = spec.get("arch", "llama")
    FS = spec.get("n_ff_shared", 0)
    w = gguf.GGUFWriter(tmp, arch)
    w.add_name(name)
    w.add_context_length(CONTEXT_LENGTH)
    w.add_embedding_length(D)
    if FS:  # qwen2moe: feed_forward_length is the shared expert's, as in Qwen's files
        w.add_feed_forward_length(FS)
        w.add_expert_feed_forward_length(F)
        w.add_expert_shared_feed_forward_length(FS)
    else:
        w.add_feed_forward_length(F)
    w.add_block_count(L)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_rope_dimension_count(hd)
    if hd != D // H:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if E:
        w.add_expert_count(E)
        w.add_expert_used_count(spec["n_used"])
    tokens, scores, ttypes = read_llama2c_tokenizer(tokenizer, V)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(ttypes)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    def tensor(tname, shape, scale, qtype, offset=0.0, extra=None):
        """shape in numpy order (rows last-dimension-contiguous)."""
        n = int(np.prod(shape))
        v = uniform(tname, seed, n).reshape(shape) * np.float32(scale) + np.float32(offset)
        if extra is not None:
            v = v + extra
        data, raw = as_type(v, qtype)
        if raw is None:
            w.add_tensor(tname, data)
        else:
            w.add_tensor(tname, data, raw_dtype=raw)

    # The shared direction of the skewed fixture.
    u = uniform("skew.direction", seed, D)
    u = u / np.linalg.norm(u)
    embd_extra = (skew * np.sqrt(D) * 0.58 * u)[None, :] if skew > 0 else None
    tensor("token_embd.weight", (V, D), 1.0, types["embd"], extra=embd_extra)
    tensor("output_norm.weight", (D,), 0.1, Q.F32, offset=1.0)
    tensor("output.weight", (V, D), 4.0 * np.sqrt(3.0 / D), types["output"])
    s_d, s_f, s_q = np.sqrt(3.0 / D), np.sqrt(3.0 / F), np.sqrt(3.0 / (H * hd))
    for l in range(L):
        b = "blk.%d." % l
        tensor(b + "attn_norm.weight", (D,), 0.1, Q.F32, offset=1.0)
        tensor(b + "attn_q.weight", (H * hd, D), s_d, types["attn"])
        tensor(b + "attn_k.weight", (HKV * hd, D), s_d, types["attn"])
        tensor(b + "attn_v.weight", (HKV * hd, D), s_d, types["attn"])
        tensor(b + "attn_output.weight", (D, H * hd), s_q, types["attn"])
        if arch == "qwen3":
            tensor(b + "attn_q_norm.weight", (hd,), 0.1, Q.F32, offset=1.0)
            tensor(b + "attn_k_norm.weight", (hd,), 0.1, Q.F32, offset=1.0)
        if arch == "qwen2moe":
            tensor(b + "attn_q.bias", (H * hd,), 0.5, Q.F32)
            tensor(b + "attn_k.bias", (HKV * hd,), 0.5, Q.F32)
            tensor(b + "attn_v.bias", (HKV * hd,), 0.5, Q.F32)
        tensor(b + "ffn_norm.weight", (D,), 0.1, Q.F32, offset=1.0)
        if not E:  # dense
            tensor(b + "ffn_gate.weight", (F, D), s_d, types["gate_up"])
            tensor(b + "ffn_up.weight", (F, D), s_d, types["gate_up"])
            tensor(b + "ffn_down.weight", (D, F), s_f, types["down"])
            continue
        router_extra = None
        if skew > 0:
            router_extra = np.zeros((E, D), dtype=np.float32)
            router_extra[0] = router_extra[1] = skew * u
        # The router stays F32, as llama.cpp's quantizer keeps it.
        tensor(b + "ffn_gate_inp.weight", (E, D), 2.0 * s_d, Q.F32, extra=router_extra)
        tensor(b + "ffn_gate_exps.weight", (E, F, D), s_d, types["gate_up"])
        tensor(b + "ffn_up_exps.weight", (E, F, D), s_d, types["gate_up"])
        tensor(b + "ffn_down_exps.weight", (E, D, F), s_f, types["down"])
        if FS:
            tensor(b + "ffn_gate_inp_shexp.weight", (D,), 2.0 * s_d, Q.F32)
            tensor(b + "ffn_gate_shexp.weight", (FS, D), s_d, types["shared_gate_up"])
            tensor(b + "ffn_up_shexp.weight", (FS, D), s_d, types["shared_gate_up"])
            tensor(b + "ffn_down_shexp.weight", (D, FS), np.sqrt(3.0 / FS), types["shared_down"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return path


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="stories15M tokenizer.bin (llama2.c)")
    ap.add_argument("--out", required=True, help="folder for the .gguf files")
    ap.add_argument("--golden", help="moe_golden.json: check each file's sha256 against it")
    ap.add_argument("--only", nargs="*", help="fixture names (default: all)")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a file's sha256 differs from the golden one (default: a "
                         "warning; the MoE tests then judge it against llama.cpp's figures)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    expected = {}
    if args.golden:
        with open(args.golden) as f:
            expected = {k: v["sha256"] for k, v in json.load(f)["fixtures"].items()}
    failed = False
    for name in args.only or FIXTURES:
        path = os.path.join(args.out, name + ".gguf")
        want = expected.get(name)
        if want and os.path.exists(path) and sha256(path) == want:
            print("[moe-fixtures] %s: present" % name, file=sys.stderr)
            continue
        build(name, FIXTURES[name], args.tokenizer, args.out)
        got = sha256(path)
        if want and got != want:
            # Seen on an AMD host for a fixture recorded on an Intel one:
            # numpy's results can differ in the last bit between CPUs.
            print("[moe-fixtures] %s: sha256 %s, the golden figures were recorded for %s "
                  "(warning: the MoE tests compare it with them, within their tolerances)"
                  % (name, got, want), file=sys.stderr)
            failed = True
        else:
            print("[moe-fixtures] %s: written (%d bytes, sha256 %s)"
                  % (name, os.path.getsize(path), got), file=sys.stderr)
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
