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
wants them), or, for the fixtures marked vocab="bpe", SmolLM2's byte-level
BPE vocabulary (--bpe-vocab) under the pre-tokenizer the fixture names.

  python3 tools/make_moe_fixtures.py --tokenizer ~/.cache/troupe/models/tokenizer.bin \\
      --bpe-vocab ~/.cache/troupe/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
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
    # Qwen 3's MoE layout (issue 33): Qwen 3's attention (QK-norm, no
    # biases, head size 64), routed experts of expert_feed_forward_length
    # rows, no shared expert, the top-k weights renormalised.  Its
    # vocabulary is SmolLM2's byte-level BPE under Qwen 2's pre-tokenizer
    # (tokenizer.ggml.pre = qwen2: one digit a piece), embeddings tied.
    "qwen3moe-4x2": dict(
        arch="qwen3moe", n_embd=128, n_ff=64, n_ff_dense=256, n_layer=2, n_head=4, n_head_kv=2,
        head_dim=64, n_expert=4, n_used=2, n_vocab=0, seed=34, skew=0.0, vocab="bpe",
        pre="qwen2", tied=True, embd_scale=0.25,
        types=dict(embd=Q.Q8_0, attn=Q.Q8_0, gate_up=Q.Q8_0, down=Q.F16, output=Q.Q8_0)),
    # Llama 3's RoPE (issue 33): the rope_freqs factors Llama 3.1's
    # converter writes (factor 8, low 1, high 4, here with an original
    # context of 128 so that most pairs are scaled), linear scaling 2 on
    # top, RoPE base 500000, and SmolLM2's vocabulary under Llama 3's
    # pre-tokenizer (llama-bpe: digits in threes, whole-word tokens).
    "llama3-rope": dict(
        arch="llama", n_embd=128, n_ff=256, n_layer=2, n_head=4, n_head_kv=2,
        n_expert=0, n_used=0, n_vocab=0, seed=35, skew=0.0, vocab="bpe", pre="llama-bpe",
        tied=True, embd_scale=0.25, rope_base=500000.0, rope_linear=2.0,
        llama3_rope=dict(factor=8.0, low=1.0, high=4.0, original_context=128),
        types=dict(embd=Q.Q8_0, attn=Q.Q8_0, gate_up=Q.Q4_0, down=Q.Q8_0, output=Q.Q8_0)),
    # K-quants, Q5_1 and BF16 (issue 33) in every role a weight has: rows
    # of 256 (K-quant super-blocks), the K-quants in two roles or more
    # across the three files, the MoE one with K-quant experts.  Their blocks are
    # random bytes under a chosen super-block scale (random_k_blocks), so
    # no K-quant quantizer is needed here; llama.cpp reads them as any.
    "kq-dense": dict(
        n_embd=256, n_ff=512, n_layer=2, n_head=4, n_head_kv=2, n_expert=0, n_used=0,
        n_vocab=2048, seed=41, skew=0.0,
        types=dict(embd=Q.Q2_K, attn=Q.Q3_K, gate_up=Q.Q5_K, down=Q.Q6_K, output=Q.Q4_K)),
    # Layer 0's attn_v is Q8_0 beside Q5_1 attn_q and attn_k, as
    # llama-quantize's Q5_K_M gives a model whose rows are no whole
    # super-blocks (attn_v per layer: types["attn_v"][l]).
    "kq-dense2": dict(
        n_embd=256, n_ff=512, n_layer=2, n_head=4, n_head_kv=2, n_expert=0, n_used=0,
        n_vocab=2048, seed=42, skew=0.0,
        types=dict(embd=Q.BF16, attn=Q.Q5_1, attn_v=[Q.Q8_0, Q.Q5_1], gate_up=Q.Q2_K,
                   down=Q.Q8_0, output=Q.Q8_0)),
    "kq-moe": dict(
        n_embd=256, n_ff=256, n_layer=2, n_head=4, n_head_kv=2, n_expert=4, n_used=2,
        n_vocab=2048, seed=43, skew=0.0,
        types=dict(embd=Q.Q6_K, attn=Q.Q4_K, gate_up=Q.Q5_K, down=Q.Q3_K, output=Q.Q2_K)),
}

# Random K-quant super-blocks: where the super-block scale d (and dmin)
# sit in the block's bytes, and dmin / d so that the values centre on 0
# (E[scale] * E[q] = E[min] * dmin / d for the types with mins).
K_BLOCKS = {
    Q.Q2_K: dict(d_at=80, dmin_at=82, dmin_ratio=1.5),
    Q.Q3_K: dict(d_at=108),
    Q.Q4_K: dict(d_at=0, dmin_at=2, dmin_ratio=7.5),
    Q.Q5_K: dict(d_at=0, dmin_at=2, dmin_ratio=15.5),
    Q.Q6_K: dict(d_at=208),
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


def read_bpe_vocab(path):
    """SmolLM2's byte-level BPE vocabulary (tokens, types, merges, BOS/EOS)."""
    r = gguf.GGUFReader(path)

    def field(name):
        return r.fields[name]

    def strings(name):
        f = field(name)
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def ints(name):
        f = field(name)
        return [int(f.parts[i][0]) for i in f.data]

    def scalar(name):
        return int(field(name).parts[-1][0])

    return dict(tokens=strings("tokenizer.ggml.tokens"), types=ints("tokenizer.ggml.token_type"),
                merges=strings("tokenizer.ggml.merges"),
                bos=scalar("tokenizer.ggml.bos_token_id"),
                eos=scalar("tokenizer.ggml.eos_token_id"))


def llama3_rope_factors(hd, base, factor, low, high, original_context):
    """The per-pair divisors Llama 3.1's converter writes as rope_freqs."""
    low_wavelen = original_context / low
    high_wavelen = original_context / high
    out = []
    for i in range(0, hd, 2):
        freq = 1.0 / (base ** (i / hd))
        wavelen = 2 * np.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original_context / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def random_k_blocks(name, seed, shape, std, qtype):
    """A K-quant tensor of random super-blocks whose values have about `std`."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    n_blocks = rows * cols // block_elems
    u = uniform(name + ".k", seed, n_blocks * block_bytes)
    raw = ((u + 1.0) * 128.0).clip(0, 255).astype(np.uint8).reshape(n_blocks, block_bytes)
    lay = K_BLOCKS[qtype]

    def set_scales(d):
        raw[:, lay["d_at"]:lay["d_at"] + 2] = np.frombuffer(
            np.float16(d).tobytes(), dtype=np.uint8)
        if "dmin_at" in lay:
            raw[:, lay["dmin_at"]:lay["dmin_at"] + 2] = np.frombuffer(
                np.float16(d * lay["dmin_ratio"]).tobytes(), dtype=np.uint8)

    set_scales(1.0)  # measure the spread at d = 1, then scale to std
    unit = float(gguf.quants.dequantize(raw, qtype).std())
    set_scales(std / unit)
    return raw.reshape(*shape[:-1], cols // block_elems * block_bytes)


def as_type(values, qtype):
    if qtype == Q.F32:
        return values.astype(np.float32), None
    if qtype == Q.F16:
        return values.astype(np.float16), None
    return gguf.quants.quantize(values.astype(np.float32), qtype), qtype


def build(name, spec, tokenizer, bpe_vocab, out_dir):
    D, F, L = spec["n_embd"], spec["n_ff"], spec["n_layer"]
    H, HKV, E = spec["n_head"], spec["n_head_kv"], spec["n_expert"]
    V, seed, skew = spec["n_vocab"], spec["seed"], spec["skew"]
    bpe = spec.get("vocab") == "bpe"
    if bpe:
        if not bpe_vocab or not os.path.exists(bpe_vocab):
            sys.exit("make_moe_fixtures.py: %s needs --bpe-vocab (SmolLM2's GGUF)" % name)
        vocab = read_bpe_vocab(bpe_vocab)
        V = len(vocab["tokens"])
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
    elif "n_ff_dense" in spec:  # qwen3moe: the experts' width has its own key
        w.add_feed_forward_length(spec["n_ff_dense"])
        w.add_expert_feed_forward_length(F)
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
    w.add_rope_freq_base(spec.get("rope_base", 10000.0))
    if "rope_linear" in spec:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(spec["rope_linear"])
    if E:
        w.add_expert_count(E)
        w.add_expert_used_count(spec["n_used"])
    if bpe:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(spec["pre"])
        w.add_token_list(vocab["tokens"])
        w.add_token_types(vocab["types"])
        w.add_token_merges(vocab["merges"])
        w.add_bos_token_id(vocab["bos"])
        w.add_eos_token_id(vocab["eos"])
    else:
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
        if qtype in K_BLOCKS:  # uniform in [-scale, scale) has std scale / sqrt(3)
            assert offset == 0.0 and extra is None, tname
            w.add_tensor(tname, random_k_blocks(tname, seed, shape, scale / np.sqrt(3.0), qtype),
                         raw_dtype=qtype)
            return
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
    # Tied classifiers read token_embd: a smaller scale keeps their logits
    # (and so the perplexity's sensitivity to rounding) in a sane range.
    tensor("token_embd.weight", (V, D), spec.get("embd_scale", 1.0), types["embd"],
           extra=embd_extra)
    tensor("output_norm.weight", (D,), 0.1, Q.F32, offset=1.0)
    if not spec.get("tied"):
        tensor("output.weight", (V, D), 4.0 * np.sqrt(3.0 / D), types["output"])
    if "llama3_rope" in spec:
        r = spec["llama3_rope"]
        w.add_tensor("rope_freqs.weight",
                     llama3_rope_factors(hd, spec["rope_base"], r["factor"], r["low"], r["high"],
                                         r["original_context"]))
    s_d, s_f, s_q = np.sqrt(3.0 / D), np.sqrt(3.0 / F), np.sqrt(3.0 / (H * hd))
    for l in range(L):
        b = "blk.%d." % l
        tensor(b + "attn_norm.weight", (D,), 0.1, Q.F32, offset=1.0)
        tensor(b + "attn_q.weight", (H * hd, D), s_d, types["attn"])
        tensor(b + "attn_k.weight", (HKV * hd, D), s_d, types["attn"])
        tensor(b + "attn_v.weight", (HKV * hd, D), s_d,
               types.get("attn_v", [types["attn"]])[l % len(types.get("attn_v", [0]))])
        tensor(b + "attn_output.weight", (D, H * hd), s_q, types["attn"])
        if arch in ("qwen3", "qwen3moe"):
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
    ap.add_argument("--bpe-vocab", help="SmolLM2's GGUF, whose byte-level BPE vocabulary the "
                                        "qwen3moe and llama3 fixtures take")
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
        build(name, FIXTURES[name], args.tokenizer, args.bpe_vocab, args.out)
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
