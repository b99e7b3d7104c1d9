#!/usr/bin/env python3
"""Writes a copy of a gemma3 GGUF that asks for final logit softcapping.

Gemma 3's own files set no cap (Gemma 2's did: 30), yet llama.cpp's gemma3
graph applies `gemma3.final_logit_softcapping` where a file gives it, and so
does troupe.  This copy of the real Gemma 3 270M file, every tensor and key
as they are plus that one key, is what tests/integration/test_models.cpp
runs against llama-perplexity's figure on the same copy
(tools/record_model_golden.py records it):

  python3 tools/make_softcap_fixture.py --model ~/.cache/troupe/models/gemma-3-270m-q4_k_m.gguf \\
      --cap 30 --out ~/.cache/troupe/models/fixtures/gemma3-softcap30.gguf

The gguf package's own copier (gguf_new_metadata) does the copying.
"""
import argparse
import os
import sys

os.environ.setdefault("TQDM_DISABLE", "1")  # the copier's progress bar, in CI logs
import gguf  # noqa: E402
from gguf.scripts.gguf_new_metadata import (  # noqa: E402
    MetadataDetails, copy_with_new_metadata, get_field_data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a gemma3 GGUF")
    ap.add_argument("--cap", type=float, default=30.0, help="the final logit cap (Gemma 2's: 30)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if os.path.exists(args.out) and os.path.getmtime(args.out) >= os.path.getmtime(args.model):
        return  # made already, from this model
    reader = gguf.GGUFReader(args.model, "r")
    arch = get_field_data(reader, gguf.Keys.General.ARCHITECTURE)
    if arch != "gemma3":
        sys.exit("%s: architecture %s, not gemma3" % (args.model, arch))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".part"
    writer = gguf.GGUFWriter(tmp, arch=arch, endianess=reader.endianess)
    alignment = get_field_data(reader, gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = alignment
    key = "gemma3.final_logit_softcapping"
    copy_with_new_metadata(reader, writer,
                           {key: MetadataDetails(gguf.GGUFValueType.FLOAT32, args.cap)}, [])
    os.replace(tmp, args.out)
    print("[fixture] %s: %s with %s = %g" % (args.out, os.path.basename(args.model), key, args.cap),
          file=sys.stderr)


if __name__ == "__main__":
    main()
