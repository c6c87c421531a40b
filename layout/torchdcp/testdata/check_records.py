"""Loads records written by torchdcp.RecordWriter with real torch.

usage: check_records.py DIR

DIR holds NAME.pt records and records.json: [{"name", "dtype", "shape",
"hex"}, ...]. Each record is loaded with torch.load(weights_only=True), as
FileSystemReader loads a chunk, and must hold a contiguous tensor of that
dtype and shape whose bytes are hex. Prints one OK line per record; exits 1
on the first mismatch.
"""
import json
import os
import sys

import torch

d = sys.argv[1]
with open(os.path.join(d, "records.json")) as f:
    recs = json.load(f)
for r in recs:
    t = torch.load(os.path.join(d, r["name"] + ".pt"), map_location="cpu", weights_only=True)
    want_dtype = getattr(torch, r["dtype"])
    got = bytes(t.contiguous().untyped_storage()).hex() if t.numel() else ""
    if t.dtype != want_dtype or list(t.shape) != r["shape"] or not t.is_contiguous() or got != r["hex"]:
        print(f"{r['name']}: got {t.dtype} {list(t.shape)} contiguous={t.is_contiguous()}, "
              f"want {want_dtype} {r['shape']}; bytes equal: {got == r['hex']}")
        sys.exit(1)
    print("OK", r["name"])
