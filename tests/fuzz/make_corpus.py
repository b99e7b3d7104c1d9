#!/usr/bin/env python3
"""Writes the binary seeds of tests/fuzz/corpus (GGUF files, llama2.c
checkpoints with their tokenizers, client frames) from a few lines each, so
they can be read and regenerated: python3 tests/fuzz/make_corpus.py.
The client frames need protoc (protobuf-compiler).  The text seeds (JSON
bodies, patterns, templates) are plain files in the corpus itself; the KV
blob seeds were written by encode_kv_blob (see tests/fuzz/README.md)."""
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def write(target, name, data):
    os.makedirs(os.path.join(CORPUS, target), exist_ok=True)
    with open(os.path.join(CORPUS, target, name), "wb") as f:
        f.write(data)


# --- GGUF (version 3, little-endian) ---
U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gkv(key, vtype, value):
    out = gstr(key) + struct.pack("<I", vtype)
    if vtype == STRING:
        return out + gstr(value)
    if vtype == U32:
        return out + struct.pack("<I", value)
    if vtype == F32:
        return out + struct.pack("<f", value)
    if vtype == BOOL:
        return out + struct.pack("<B", value)
    elem, items = value
    out += struct.pack("<IQ", elem, len(items))
    for x in items:
        out += gstr(x) if elem == STRING else struct.pack("<f" if elem == F32 else "<i", x)
    return out


def gguf(kvs, tensors, version=3, alignment=32):
    """tensors: (name, shape) of F32, laid out back to back, aligned."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    head += b"".join(gkv(*kv) for kv in kvs)
    offset, infos, data = 0, b"", b""
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        infos += gstr(name) + struct.pack("<I", len(shape)) + b"".join(
            struct.pack("<Q", d) for d in shape) + struct.pack("<IQ", 0, offset)
        blob = b"".join(struct.pack("<f", (i % 7) / 8.0) for i in range(n))
        blob += b"\0" * (-len(blob) % alignment)
        data += blob
        offset += len(blob)
    out = head + infos
    return out + b"\0" * (-len(out) % alignment) + data


def llama_tensors(embd, ff, vocab, layers, kv_dim=None, bias=False, tied=True):
    kv_dim = kv_dim or embd
    t = [("token_embd.weight", [embd, vocab]), ("output_norm.weight", [embd])]
    if not tied:
        t.append(("output.weight", [embd, vocab]))
    for l in range(layers):
        b = f"blk.{l}."
        t += [(b + "attn_norm.weight", [embd]), (b + "attn_q.weight", [embd, embd]),
              (b + "attn_k.weight", [embd, kv_dim]), (b + "attn_v.weight", [embd, kv_dim]),
              (b + "attn_output.weight", [embd, embd]), (b + "ffn_norm.weight", [embd]),
              (b + "ffn_gate.weight", [embd, ff]), (b + "ffn_up.weight", [embd, ff]),
              (b + "ffn_down.weight", [ff, embd])]
        if bias:
            t += [(b + "attn_q.bias", [embd]), (b + "attn_k.bias", [kv_dim]),
                  (b + "attn_v.bias", [kv_dim])]
    return t


def hparams(arch, embd, ff, heads, heads_kv, layers=1):
    a = arch + "."
    return [("general.architecture", STRING, arch), (a + "block_count", U32, layers),
            (a + "embedding_length", U32, embd), (a + "feed_forward_length", U32, ff),
            (a + "attention.head_count", U32, heads), (a + "attention.head_count_kv", U32, heads_kv),
            (a + "context_length", U32, 64), (a + "attention.layer_norm_rms_epsilon", F32, 1e-5),
            (a + "rope.freq_base", F32, 10000.0)]


spm_tokens = ["<unk>", "<s>", "</s>", "\u2581a", "b", "\u2581Once"]
write("gguf", "llama_spm.gguf", gguf(
    hparams("llama", 4, 8, 2, 1) + [
        ("general.alignment", U32, 32), ("general.name", STRING, "tiny"),
        ("tokenizer.ggml.model", STRING, "llama"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, spm_tokens)),
        ("tokenizer.ggml.scores", ARRAY, (F32, [0.0, 0.0, 0.0, -1.0, -2.0, -3.0])),
        ("tokenizer.ggml.token_type", ARRAY, (I32, [2, 3, 3, 1, 1, 1])),
        ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.add_bos_token", BOOL, 1),
        ("tokenizer.chat_template", STRING, "[INST] <<SYS>> {{ messages }}")],
    llama_tensors(4, 8, 6, 1, kv_dim=2, tied=False)))
bpe_tokens = ["a", "b", "\u0120", "ab", "<|im_start|>", "<|im_end|>"]
write("gguf", "qwen2_bpe.gguf", gguf(
    hparams("qwen2", 4, 4, 1, 1, layers=2) + [
        ("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.pre", STRING, "smollm"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, bpe_tokens)),
        ("tokenizer.ggml.merges", ARRAY, (STRING, ["a b"])),
        ("tokenizer.ggml.token_type", ARRAY, (I32, [1, 1, 1, 1, 3, 3])),
        ("tokenizer.chat_template", STRING, "<|im_start|>{{ m }}<|im_end|>")],
    llama_tensors(4, 4, 6, 2, bias=True), version=2))
# Gemma 3: QK-norm, sandwich norms, a sliding window every layer but the
# sixth, a head size of its own (key_length), no chat template.
gemma_tensors = llama_tensors(4, 8, 6, 1, kv_dim=2) + [
    ("blk.0.attn_q_norm.weight", [2]), ("blk.0.attn_k_norm.weight", [2]),
    ("blk.0.post_attention_norm.weight", [4]), ("blk.0.post_ffw_norm.weight", [4])]
write("gguf", "gemma3_spm.gguf", gguf(
    hparams("gemma3", 4, 8, 2, 1) + [
        ("gemma3.attention.key_length", U32, 2), ("gemma3.attention.value_length", U32, 2),
        ("gemma3.attention.sliding_window", U32, 16),
        ("tokenizer.ggml.model", STRING, "llama"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, spm_tokens)),
        ("tokenizer.ggml.scores", ARRAY, (F32, [0.0, 0.0, 0.0, -1.0, -2.0, -3.0])),
        ("tokenizer.ggml.token_type", ARRAY, (I32, [2, 3, 3, 1, 1, 1])),
        ("tokenizer.ggml.add_space_prefix", BOOL, 0)],
    gemma_tensors))
write("gguf", "header_only.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) +
      gkv("general.architecture", STRING, "llama"))

# --- llama2.c: the checkpoint, then its tokenizer.bin (the harness splits them) ---


def llama2c(dim, hidden, layers, heads, kv_heads, vocab, seq_len, pieces):
    head = dim // heads
    kv = head * kv_heads
    v = abs(vocab)
    floats = v * dim + layers * (dim + dim * dim + 2 * dim * kv) + \
        layers * (dim * dim + dim + 3 * dim * hidden) + dim + seq_len * head
    if vocab < 0:
        floats += v * dim
    model = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, seq_len)
    model += b"".join(struct.pack("<f", (i % 5) / 10.0) for i in range(floats))
    tok = struct.pack("<i", max(len(p.encode()) for p in pieces))
    for i, p in enumerate(pieces):
        b = p.encode()
        tok += struct.pack("<fi", -float(i), len(b)) + b
    return model + tok


write("llama2c", "tiny_shared.bin", llama2c(2, 2, 1, 1, 1, 4, 2, ["<unk>", "<s>", "</s>", " a"]))
write("llama2c", "tiny_unshared.bin",
      llama2c(4, 4, 1, 2, 1, -5, 4, ["<unk>", "\n<s>\n", "\n</s>\n", "b", " Once"]))
bytes_pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + [" the", "x"]
write("llama2c", "byte_fallback.bin", llama2c(2, 2, 1, 1, 1, len(bytes_pieces), 2, bytes_pieces))

# --- client frames: wire::ClientMessage in protobuf's text format, encoded by protoc ---
frames = {
    "generate_text": 'protocol_version: 1 generate { request_id: 7 text: "Once upon a time" '
                     'max_tokens: 16 stop: "\\n" sampling { temperature: 0.7 top_k: 40 seed: 3 } }',
    "generate_tokens": 'protocol_version: 1 generate { request_id: 8 tokens { ids: [1, 3, 260] } '
                       'stop_token_ids: [2] logprobs: 2 draft_tokens: 4 stream: false }',
    "generate_chat": 'protocol_version: 1 generate { request_id: 9 chat { messages { role: "system" '
                     'content: "Be brief." } messages { role: "user" content: "Hi there" } } '
                     'guided_json: "{\\"type\\":\\"object\\",\\"properties\\":{\\"a\\":{\\"type\\":'
                     '\\"integer\\"}}}" request_class: OFFLINE slo_ttft_ms: 500 }',
    "generate_regex": 'protocol_version: 1 generate { request_id: 10 text: "the" '
                      'guided_regex: "(yes|no)[0-9]{1,3}" }',
    "generate_choice": 'protocol_version: 1 generate { request_id: 11 text: "ab" '
                       'guided_choice { choices: ["red", "green"] } ignore_eos: true }',
    "generate_json_object": 'protocol_version: 1 generate { request_id: 12 text: "x" '
                            'json_object: true max_tokens: 100 }',
    "generate_embedding": 'protocol_version: 1 generate { request_id: 13 text: "Once upon a time" '
                          'embedding: true stream: false }',
    "cancel": "protocol_version: 1 cancel { request_id: 7 }",
    "ping": "protocol_version: 1 ping { nonce: 42 }",
}
protoc = os.environ.get("PROTOC", "protoc")
for name, text in frames.items():
    try:
        data = subprocess.run([protoc, "--encode=troupe.wire.ClientMessage", "-I", ROOT,
                               os.path.join(ROOT, "messages", "client.proto")],
                              input=text.encode(), capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"protoc failed for {name}: {e}")
    write("client_message", name + ".pb", data)
# Not UTF-8 in generate.text: the gateway's invalid_utf8_field path.
write("client_message", "bad_utf8.pb", b"\x08\x01\x12\x07\x08\x05\x12\x03a\xff\xfe")
print("corpus written to", CORPUS)
