#!/usr/bin/env python3
"""Writes the vision-encoder GGUF fixture (an llama.cpp "mmproj") and its test images.

No real vision model can be fetched here, so image input is tested on a file
with seeded random weights in the layout of a real one: a CLIP ViT encoder
with a LLaVA-1.5 projector (clip.projector_type "mlp": mm.0, GELU, mm.2), as
llama.cpp's converter writes it for LLaVA-1.5 (class embedding, learned
position embeddings, pre-layernorm, no post-layernorm, quick-GELU in the
encoder's MLP, biases everywhere but the patch convolution, CLIP's mean and
std).  It is tiny (56x56 pixels, 14x14 patches: 16 image positions; width
64, 4 heads, 3 layers of which llama.cpp runs the first 2) and its projector
writes SmolLM2-135M's width (576), so llama-server takes it with
`-m SmolLM2-135M-Instruct.Q4_1.gguf --mmproj <this file>`; llama.cpp's
answers on it are in tests/data/vision_golden.json
(tools/record_vision_golden.py).

The weights come from the same counter-based hash as the MoE fixtures
(tools/make_moe_fixtures.py: splitmix64 of the tensor's name and the element
index, independent of numpy's version), all F32.  The projector's second
matrix is scaled so that the image embeddings have about the per-element RMS
of SmolLM2's token embeddings (0.136, measured on its Q8_0 token_embd):
neither a whisper the model ignores nor a shout that swamps the text.

The test images are written here too (--png, --png-transposed): 56x56 RGB,
an integer-only pattern (colour ramps, a diagonal wave, a filled square, a
line) and its transpose, which must give another completion (or the image
would have no effect and the test would prove nothing).

  python3 tools/make_vision_fixture.py --out ~/.cache/troupe/models/llava-fixture-mmproj.gguf \\
      --png tests/data/vision_pattern.png --png-transposed tests/data/vision_pattern_t.png \\
      [--golden tests/data/vision_golden.json]

--reference IMAGE.png prints the projected embeddings of a numpy re-implementation of
llama.cpp's encoder for this projector (the spec it follows is the module's
encode(); tools/record_vision_golden.py compares it with llama.cpp's own).

Needs the PyPI packages gguf (0.19) and numpy.
"""
import argparse
import hashlib
import json
import os
import struct
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import gguf
    from make_moe_fixtures import uniform  # noqa: E402  (splitmix64 weights)
except ImportError:  # pragma: no cover - a message instead of a trace
    sys.exit("make_vision_fixture.py needs the PyPI package gguf (pip install gguf==0.19.0)")

# The encoder's shape.  LLaVA-1.5's is image 336, patch 14, width 1024,
# 16 heads, FFN 4096, 23 layers in the file (24 in CLIP ViT-L/14, the last
# dropped by the converter), projector 1024 -> 4096 -> 4096.  The seed is the
# first of 101-136 under which every recorded greedy completion runs 19
# tokens or more (or to its end) before llama.cpp's two best candidates come
# within 0.1 in log-probability (the golden tests' near-tie), and the two
# images' completions differ for each prompt.
SPEC = dict(image_size=56, patch_size=14, n_embd=64, n_head=4, n_ff=128, n_layer=3,
            n_embd_text=576, eps=1e-5, seed=124,
            # CLIP's normalisation (OpenAI CLIP, as LLaVA-1.5's processor has it)
            mean=[0.48145466, 0.4578275, 0.40821073], std=[0.26862954, 0.26130258, 0.27577711])
# Gain of mm.2 (and its bias) over a unit-variance init, chosen once with
# --reference: the test images' embeddings then have a per-element RMS of
# 0.135 and 0.139 (SmolLM2's token embeddings: 0.136).
MM2_GAIN = 0.135
NAME = "llava-fixture-mmproj"


def make_weights(spec=SPEC):
    """The tensors, by GGUF name, as numpy arrays in GGUF row-major order."""
    D, F, L, P = spec["n_embd"], spec["n_ff"], spec["n_layer"], spec["patch_size"]
    T, seed = spec["n_embd_text"], spec["seed"]
    n_pos = (spec["image_size"] // P) ** 2 + 1  # + the class token
    w = {}

    def t(name, shape, scale, offset=0.0):
        n = int(np.prod(shape))
        w[name] = (uniform(name, seed, n).reshape(shape) * np.float32(scale)
                   + np.float32(offset)).astype(np.float32)

    # uniform in [-s, s) with s = sqrt(3 / fan_in): unit variance out of
    # unit-variance inputs.  PyTorch's conv layout (OC, IC, KH, KW); no bias,
    # as CLIP's patch convolution has none.
    t("v.patch_embd.weight", (D, 3, P, P), np.sqrt(3.0 / (3 * P * P)))
    t("v.class_embd", (D,), 1.0)
    t("v.position_embd.weight", (n_pos, D), 0.5)
    t("v.pre_ln.weight", (D,), 0.1, offset=1.0)
    t("v.pre_ln.bias", (D,), 0.1)
    s_d, s_f = np.sqrt(3.0 / D), np.sqrt(3.0 / F)
    for il in range(L):
        b = "v.blk.%d." % il
        t(b + "ln1.weight", (D,), 0.1, offset=1.0)
        t(b + "ln1.bias", (D,), 0.1)
        for m in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(b + m + ".weight", (D, D), s_d)
            t(b + m + ".bias", (D,), 0.1)
        t(b + "ln2.weight", (D,), 0.1, offset=1.0)
        t(b + "ln2.bias", (D,), 0.1)
        t(b + "ffn_up.weight", (F, D), s_d)
        t(b + "ffn_up.bias", (F,), 0.1)
        t(b + "ffn_down.weight", (D, F), s_f)
        t(b + "ffn_down.bias", (D,), 0.1)
    t("mm.0.weight", (T, D), s_d)
    t("mm.0.bias", (T,), 0.1)
    t("mm.2.weight", (T, T), np.sqrt(3.0 / T) * MM2_GAIN)
    t("mm.2.bias", (T,), 0.1 * MM2_GAIN)
    return w


def read_weights(path):
    """The F32 tensors of an mmproj GGUF, by name, in GGUF row-major (numpy) order."""
    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ValueError("%s: %s is %s, the reference takes F32 only"
                             % (path, t.name, t.tensor_type.name))
        out[t.name] = np.array(t.data, dtype=np.float32).reshape(
            tuple(int(n) for n in reversed(t.shape)))
    return out


def write_gguf(path, spec=SPEC):
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, "clip")
    w.add_name(NAME)
    w.add_description("seeded random weights in LLaVA-1.5's layout (troupe test fixture)")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_clip_has_vision_encoder(True)
    w.add_bool(gguf.Keys.Clip.HAS_LLAVA_PROJECTOR, True)  # legacy key, as the converter writes it
    w.add_clip_projector_type("mlp")
    w.add_vision_image_size(spec["image_size"])
    w.add_vision_patch_size(spec["patch_size"])
    w.add_vision_embedding_length(spec["n_embd"])
    w.add_vision_feed_forward_length(spec["n_ff"])
    w.add_vision_block_count(spec["n_layer"])
    w.add_vision_head_count(spec["n_head"])
    w.add_vision_attention_layernorm_eps(spec["eps"])
    w.add_vision_projection_dim(spec["n_embd_text"])  # CLIP's visual projection: unused by llava
    w.add_vision_image_mean(spec["mean"])
    w.add_vision_image_std(spec["std"])
    w.add_vision_use_gelu(False)  # CLIP's quick_gelu (llama.cpp: FFN_GELU_QUICK)
    for name, arr in make_weights(spec).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


#
# The test images: PNG by hand (stdlib zlib), 8-bit RGB, no interlace.
#

def pattern(size):
    """size x size x 3 uint8, integer arithmetic only."""
    img = np.zeros((size, size, 3), dtype=np.int64)
    y, x = np.mgrid[0:size, 0:size]
    img[..., 0] = x * 255 // (size - 1)                      # red ramp, left to right
    img[..., 1] = y * 255 // (size - 1)                      # green ramp, top to bottom
    t = (x + 2 * y) % 28
    img[..., 2] = 40 + 12 * np.abs(t - 14)                   # diagonal triangle wave
    sq = (y >= size // 7) & (y < size * 3 // 8) & (x >= size * 5 // 8) & (x < size * 6 // 7)
    img[sq] = (20, 40, 200)                                  # a blue square, top right
    line = (x == (y * 3) // 4) & (y > size // 2)
    img[line] = (250, 250, 250)                              # a white line, bottom left
    return img.astype(np.uint8)


def write_png(path, img):
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw, 9)))
        f.write(chunk(b"IEND", b""))


def read_png(path):
    """8-bit RGB or RGBA non-interlaced PNG -> H x W x 3 uint8 (alpha dropped)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    at, idat, hdr = 8, b"", None
    while at < len(data):
        n, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + n]
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        at += 12 + n
    w, h, depth, ctype, _, _, interlace = hdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        raise ValueError("%s: only 8-bit RGB/RGBA non-interlaced PNGs" % path)
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    out = np.zeros((h, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.int64)
    for r in range(h):
        ft = raw[r * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, r * (stride + 1) + 1).astype(np.int64)
        cur = np.zeros(stride, dtype=np.int64)
        for i in range(stride):
            a = cur[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ft == 0:
                p = 0
            elif ft == 1:
                p = a
            elif ft == 2:
                p = b
            elif ft == 3:
                p = (a + b) // 2
            else:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                p = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[i] = (line[i] + p) & 0xFF
        out[r] = cur
        prev = cur
    return out.reshape(h, w, bpp)[..., :3]


#
# A numpy re-implementation of what llama.cpp computes for this projector
# (see the written spec); matrix products in float32, where ggml rounds to
# half precision so does this (the patch convolution's im2col, the GELU
# tables).
#

def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def _gelu_tanh(x):
    x = x.astype(np.float32)
    c, a = np.float32(0.79788456080286535587989211986876), np.float32(0.044715)
    one, half = np.float32(1.0), np.float32(0.5)
    return (half * x * (one + np.tanh(c * x * (one + a * x * x)))).astype(np.float32)


def gelu_table(x):
    """ggml's CPU GELU for F32 (GGML_GELU_FP16): half-precision table, exact outside +-10."""
    y = f16(_gelu_tanh(f16(x)))
    y = np.where(x <= -10.0, np.float32(0.0), y)
    return np.where(x >= 10.0, x, y).astype(np.float32)


def gelu_quick_table(x):
    """ggml's CPU quick GELU for F32 (GGML_GELU_QUICK_FP16): half-precision table."""
    h = f16(x)
    return f16(h * (np.float32(1.0) / (np.float32(1.0) + np.exp(np.float32(-1.702) * h))))


def layer_norm(x, w, b, eps):
    x64 = x.astype(np.float64)
    mean = (x64.sum(-1, keepdims=True) / x.shape[-1]).astype(np.float32)
    c = x - mean
    var = (c.astype(np.float64) ** 2).sum(-1, keepdims=True) / x.shape[-1]
    scale = (np.float32(1.0) / np.sqrt(np.float32(var) + np.float32(eps))).astype(np.float32)
    return ((c * scale) * w + b).astype(np.float32)


def preprocess(rgb, spec=SPEC):
    """uint8 H x W x 3 (already image_size square) -> float32 3 x H x W."""
    n = spec["image_size"]
    if rgb.shape[:2] != (n, n):
        raise ValueError("the reference only takes %dx%d images (llama.cpp would resize)" % (n, n))
    x = rgb.astype(np.float32) / np.float32(255.0)
    x = (x - np.float32(spec["mean"])) / np.float32(spec["std"])
    return np.ascontiguousarray(x.transpose(2, 0, 1)).astype(np.float32)


def encode(rgb, weights=None, spec=SPEC):
    """The projected image embeddings, n_patches x n_embd_text, float32."""
    w = weights or make_weights(spec)
    P, D, H = spec["patch_size"], spec["n_embd"], spec["n_head"]
    eps, dh = spec["eps"], spec["n_embd"] // spec["n_head"]
    x = preprocess(rgb, spec)
    g = spec["image_size"] // P
    # patches in row-major order (py, px), each flattened as (c, ky, kx)
    pt = x.reshape(3, g, P, g, P).transpose(1, 3, 0, 2, 4).reshape(g * g, 3 * P * P)
    k = w["v.patch_embd.weight"].reshape(D, 3 * P * P)
    inp = f16(pt) @ f16(k).T                                  # [n_patches, D]
    inp = np.concatenate([inp, w["v.class_embd"][None, :]], 0)  # class token LAST
    inp = inp + w["v.position_embd.weight"][: inp.shape[0]]
    cur = layer_norm(inp, w["v.pre_ln.weight"], w["v.pre_ln.bias"], eps)
    n_pos = cur.shape[0]
    scale = np.float32(1.0 / np.sqrt(np.float32(dh)))
    for il in range(spec["n_layer"] - 1):  # the last layer is not run
        b = "v.blk.%d." % il
        h = layer_norm(cur, w[b + "ln1.weight"], w[b + "ln1.bias"], eps)
        q = (h @ w[b + "attn_q.weight"].T + w[b + "attn_q.bias"]).reshape(n_pos, H, dh)
        kk = (h @ w[b + "attn_k.weight"].T + w[b + "attn_k.bias"]).reshape(n_pos, H, dh)
        v = (h @ w[b + "attn_v.weight"].T + w[b + "attn_v.bias"]).reshape(n_pos, H, dh)
        s = np.einsum("qhd,khd->hqk", q, kk).astype(np.float32) * scale
        s = np.exp(s - s.max(-1, keepdims=True))
        s = (s / s.sum(-1, keepdims=True)).astype(np.float32)
        a = np.einsum("hqk,khd->qhd", s, v).reshape(n_pos, D).astype(np.float32)
        cur = cur + (a @ w[b + "attn_out.weight"].T + w[b + "attn_out.bias"])
        h = layer_norm(cur, w[b + "ln2.weight"], w[b + "ln2.bias"], eps)
        h = gelu_quick_table(h @ w[b + "ffn_up.weight"].T + w[b + "ffn_up.bias"])
        cur = (cur + (h @ w[b + "ffn_down.weight"].T + w[b + "ffn_down.bias"])).astype(np.float32)
    feats = cur[1:1 + g * g]   # rows 1..n_patches: drops patch 0, keeps the class token
    h = gelu_table(feats @ w["mm.0.weight"].T + w["mm.0.bias"])
    return (h @ w["mm.2.weight"].T + w["mm.2.bias"]).astype(np.float32)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="the mmproj .gguf to write")
    ap.add_argument("--png", help="write the test pattern (image_size square RGB PNG) here")
    ap.add_argument("--png-transposed", help="write the transposed pattern here")
    ap.add_argument("--golden", help="vision_golden.json: check the files' sha256 against it")
    ap.add_argument("--reference", nargs="*", default=[],
                    help="PNGs to run the numpy re-implementation on (prints embedding stats; "
                         "the weights of --out when given, else made here)")
    args = ap.parse_args()
    if not (args.out or args.png or args.png_transposed or args.reference):
        ap.error("nothing to do (--out, --png, --png-transposed or --reference)")
    expected = {}
    if args.golden:
        with open(args.golden) as f:
            g = json.load(f)
        expected = {os.path.basename(p): h for p, h in g.get("sha256", {}).items()}
    written = []
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        write_gguf(args.out)
        written.append(args.out)
    img = pattern(SPEC["image_size"])
    if args.png:
        write_png(args.png, img)
        written.append(args.png)
    if args.png_transposed:
        write_png(args.png_transposed, np.ascontiguousarray(img.transpose(1, 0, 2)))
        written.append(args.png_transposed)
    mismatched = False
    for path in written:
        got = sha256(path)
        want = expected.get(os.path.basename(path))
        note = ""
        if want and want != got:
            note = " (differs from the golden %s: its figures are for other bytes)" % want
            mismatched = True
        print("[vision-fixture] %s: written (%d bytes, sha256 %s)%s"
              % (path, os.path.getsize(path), got, note), file=sys.stderr)
    if args.reference:
        weights = read_weights(args.out) if args.out else make_weights()
        for path in args.reference:
            e = encode(read_png(path), weights)
            rms = float(np.sqrt((e.astype(np.float64) ** 2).mean()))
            print("[vision-fixture] %s: embeddings %dx%d rms %.4f mean %.4f min %.4f max %.4f"
                  % (path, e.shape[0], e.shape[1], rms, float(e.mean()), float(e.min()),
                     float(e.max())), file=sys.stderr)
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
