"""Checks DCP directories written by ckptfs's Go DCP writer with real torch.

usage: check_load.py DIR [DIR ...]

Each DIR has a sibling DIR.expect.json written by the Go tests:
  {"tensors": [{"fqn", "path", "dtype", "shape", "hex", "boxes"}, ...],
   "present": [[path elements], ...]}   (optional)

For every DIR, single process, no process group:
  1. FileSystemReader.read_metadata(): every expected fqn has the torch dtype,
     global size and chunk boxes (offsets, sizes) the Go side planned.
  2. dcp.load into a nested state dict of plain tensors (nested by the planner
     path, e.g. {"model": {"w": t}}): every tensor's bytes equal the source.
  3. dcp_to_torch_save, then torch.load(weights_only=True): the same bytes at
     the same nested path; every "present" path exists (int elements index
     lists, as planner_data with int elements unflattens to lists).
Prints one OK line per directory; exits 1 on the first mismatch.
"""
import json
import os
import sys
import tempfile
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as md
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

warnings.filterwarnings("ignore")


def raw(t):
    return bytes(t.detach().contiguous().clone().untyped_storage()).hex()


def put(d, path, value):
    for p in path[:-1]:
        d = d.setdefault(p, {})
    d[path[-1]] = value


def get(d, path):
    for p in path:
        d = d[p]
    return d


def fail(msg):
    print("FAIL", msg, flush=True)
    sys.exit(1)


def check(dir_):
    with open(dir_.rstrip("/") + ".expect.json") as f:
        exp = json.load(f)
    tensors = exp["tensors"]

    meta = FileSystemReader(dir_).read_metadata()
    for e in tensors:
        item = meta.state_dict_metadata.get(e["fqn"])
        if not isinstance(item, md.TensorStorageMetadata):
            fail(f"{dir_}: {e['fqn']}: not a tensor in .metadata: {item!r}")
        if item.properties.dtype != getattr(torch, e["dtype"]):
            fail(f"{dir_}: {e['fqn']}: dtype {item.properties.dtype} != {e['dtype']}")
        if list(item.size) != e["shape"]:
            fail(f"{dir_}: {e['fqn']}: size {list(item.size)} != {e['shape']}")
        boxes = [[list(c.offsets), list(c.sizes)] for c in item.chunks]
        if boxes != e["boxes"]:
            fail(f"{dir_}: {e['fqn']}: chunks {boxes} != {e['boxes']}")
        if meta.planner_data[e["fqn"]] != tuple(e["path"]):
            fail(f"{dir_}: {e['fqn']}: planner path {meta.planner_data[e['fqn']]} != {e['path']}")

    sd = {}
    for e in tensors:
        put(sd, e["path"], torch.empty(e["shape"], dtype=getattr(torch, e["dtype"])))
    dcp.load(sd, checkpoint_id=dir_)
    for e in tensors:
        got = raw(get(sd, e["path"]))
        if got != e["hex"]:
            fail(f"{dir_}: dcp.load {e['fqn']}: bytes differ:\n got  {got}\n want {e['hex']}")

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "full.pt")
        dcp_to_torch_save(dir_, out)
        full = torch.load(out, weights_only=True)
    for e in tensors:
        t = get(full, e["path"])
        if t.dtype != getattr(torch, e["dtype"]) or list(t.shape) != e["shape"]:
            fail(f"{dir_}: dcp_to_torch_save {e['fqn']}: {t.dtype} {list(t.shape)}")
        if raw(t) != e["hex"]:
            fail(f"{dir_}: dcp_to_torch_save {e['fqn']}: bytes differ")
    for path in exp.get("present") or []:
        try:
            get(full, path)
        except (KeyError, IndexError, TypeError) as err:
            fail(f"{dir_}: dcp_to_torch_save: path {path} missing ({err!r}); top keys {list(full)}")
    print(f"OK {os.path.basename(dir_)}: {len(tensors)} tensors, torch {torch.__version__}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for d in sys.argv[1:]:
        check(d)
