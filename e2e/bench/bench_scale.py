"""The scale section of bench.py: DCP checkpoints of W ranks (gen_scale.py:
Llama-405B-shaped, FSDP dim-0 shards, sparse shard files), with and without
Adam state. For each: `ckptfs inspect` (seconds, peak RSS), a mount's first
`ls` of the view and first byte of a view file (the index: the first page of
a safetensors file holds tensor bytes, which sparse shards do not have), the mount's resident memory
per open view (three copies of the checkpoint opened in turn), its peak RSS,
and torch's own pickle.load of the same .metadata in the same run; the cost
per chunk (µs of inspect, resident bytes per chunk of the view).

    python e2e/bench/bench_scale.py --bin bin/ckptfs --work .bench [--ranks 64,256,1024,2048] [--adam both|yes|no]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable

sys.path.insert(0, HERE)
from bench import Mount, drop_caches, gen, log  # noqa: E402

PICKLE_LOAD = """
import pickle, sys, time
import torch.distributed.checkpoint.metadata, torch.distributed.checkpoint.filesystem
t = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    pickle.load(f)
print(time.perf_counter() - t)
"""


def timed(cmd):
    """Wall seconds and peak RSS (MiB) of a command, by /usr/bin/time."""
    r = subprocess.run(["/usr/bin/time", "-f", "%e %M", *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, check=True)
    secs, kib = r.stderr.strip().splitlines()[-1].split()
    return float(secs), int(kib) / 1024, r.stdout


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024


def copies(src, n):
    """n directories holding src's files as hard links: n checkpoints to a mount."""
    base = src + f".x{n}"
    if not os.path.exists(base + ".done"):
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(base)
        for i in range(n):
            subprocess.run(["cp", "-al", src, os.path.join(base, f"c{i}")], check=True)
        open(base + ".done", "w").close()
    return base


def case(binary, work, ranks, adam):
    name = f"scale_w{ranks}{'_adam' if adam else ''}"
    src = gen(work, name, "gen_scale.py", "--ranks", str(ranks), *(["--adam"] if adam else []))
    meta = os.path.join(src, ".metadata")
    out = dict(ranks=ranks, adam=adam, metadata_MiB=round(os.path.getsize(meta) / 2**20, 1))

    drop_caches()
    secs, peak, js = timed([binary, "inspect", "--json", src])
    rep = json.loads(js)
    chunks = sum(t["chunks"] for t in rep["tensors"])
    in_view = {n for v in rep.get("view_tensors", []) for n in v["sources"]}
    view_chunks = sum(t["chunks"] for t in rep["tensors"] if t["name"] in in_view)
    out.update(tensors=len(rep["tensors"]), chunks=chunks, view_chunks=view_chunks,
               inspect_s=round(secs, 2), inspect_peak_MiB=round(peak), inspect_us_per_chunk=round(secs * 1e6 / chunks, 2))

    secs, peak, _ = timed([PY, "-c", PICKLE_LOAD, meta])
    out.update(torch_load_s=round(secs, 2), torch_load_peak_MiB=round(peak),
               inspect_speedup=round(secs / out["inspect_s"], 1),
               inspect_memory_ratio=round(out["inspect_peak_MiB"] / peak, 3))

    # Three copies in one mount: each view opened in turn (ls, first byte).
    base = copies(src, 3)
    mnt = os.path.join(work, "mnt")
    drop_caches()
    m = Mount(binary, base, mnt)
    try:
        first_ls, first_byte, resident = [], [], []
        for i in range(3):
            before = rss_mib(m.proc.pid)
            d = os.path.join(mnt, f"c{i}")
            t = time.perf_counter()
            names = os.listdir(d)
            first_ls.append(time.perf_counter() - t)
            # The index: a generated view file (a safetensors file's first
            # page holds tensor bytes, which the sparse shards do not).
            t = time.perf_counter()
            with open(os.path.join(d, "model.safetensors.index.json"), "rb") as fh:
                fh.read(1)
            first_byte.append(time.perf_counter() - t)
            resident.append(rss_mib(m.proc.pid) - before)
        st = m.stats()
        counted = sorted(v.get("metadata_bytes", 0) for v in st["views"])
        out.update(counted_per_view_MiB=[round(b / 2**20) for b in counted],
                   counted_bytes_per_view_chunk=round(counted[-1] / max(view_chunks, 1)),
                   metadata_budget_MiB=round(st["metadata_budget"] / 2**20))
        out.update(first_ls_s=[round(x, 2) for x in first_ls], first_byte_s=[round(x, 3) for x in first_byte],
                   resident_per_view_MiB=[round(x) for x in resident],
                   resident_bytes_per_view_chunk=round(resident[0] * 2**20 / max(view_chunks, 1)),
                   mount_rss_3_views_MiB=round(rss_mib(m.proc.pid)), mount_peak_MiB=round(m.peak_rss_mib()))
    finally:
        m.close()
    log(f"  {name}: {json.dumps(out)}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", default=".bench")
    ap.add_argument("--ranks", default="64,256,1024,2048")
    ap.add_argument("--adam", default="both", choices=["both", "yes", "no"])
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    binary = os.path.abspath(a.bin)
    adams = {"both": [False, True], "yes": [True], "no": [False]}[a.adam]
    rows = [case(binary, work, int(w), adam) for w in a.ranks.split(",") for adam in adams]
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
