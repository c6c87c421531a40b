"""The scale section of bench.py: DCP checkpoints of W ranks (gen_scale.py:
Llama-405B-shaped, FSDP dim-0 shards, sparse shard files), with and without
Adam state. For each: `ckptfs inspect` (seconds, peak RSS), a mount's first
`ls` of the view and first byte of a view file (the index: the first page of
a safetensors file holds tensor bytes, which sparse shards do not have), the mount's resident memory
per open view (three copies of the checkpoint opened in turn), its peak RSS,
and torch's own pickle.load of the same .metadata in the same run; the cost
per chunk (µs of inspect, resident bytes per chunk of the view).

Other formats at scale (--formats): a Megatron torch_dist MoE of 1024
ranks (gen_megatron_moe_scale.py, with and without optimizer state; torch's
pickle.load of its .metadata is the baseline), DeepSpeed ZeRO-3 of W ranks
(gen_deepspeed_scale.py: real bytes, every view byte read through a mount
and checked; torch.load of every rank file, as zero_to_fp32.py starts, is
the baseline; ZeRO-2 too; the rank files the mount holds open after the first byte and
after the whole read show what is opened on first use) and HF-sharded
safetensors of W files (gen_hfsharded_scale.py: sparse; torch's
HuggingFaceStorageReader.read_metadata is the baseline).

    python e2e/bench/bench_scale.py --bin bin/ckptfs --work .bench [--ranks 64,256,1024,2048] [--adam both|yes|no]
        [--formats dcp,megatron,deepspeed,hfsharded] [--deepspeed-ranks 512] [--hfsharded-files 1024]
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


TORCH_LOAD_RANKS = """
import glob, os, sys, time, torch
t = time.perf_counter()
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*_states.pt"))):
    torch.load(f, map_location="cpu", weights_only=False)
print(time.perf_counter() - t)
"""

HF_READ_METADATA = """
import sys, time
from torch.distributed.checkpoint import HuggingFaceStorageReader
t = time.perf_counter()
HuggingFaceStorageReader(sys.argv[1]).read_metadata()
print(time.perf_counter() - t)
"""


def open_files_under(pid, root):
    """How many descriptors pid holds on files under root."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith(root + "/")
        except OSError:
            pass
    return n


def inspect_row(binary, src):
    drop_caches()
    secs, peak, js = timed([binary, "inspect", "--json", src])
    rep = json.loads(js)
    chunks = sum(t["chunks"] for t in rep["tensors"])
    return dict(tensors=len(rep["tensors"]), chunks=chunks, inspect_s=round(secs, 2), inspect_peak_MiB=round(peak))


def baseline(out, script, arg):
    """torch's own load: its seconds as the script times them (the import
    of torch left out), the process's wall time and peak RSS."""
    wall, peak, stdout = timed([PY, "-c", script, arg])
    secs = float(stdout.split()[-1])
    out.update(torch_s=round(secs, 2), torch_wall_s=round(wall, 2), torch_peak_MiB=round(peak),
               inspect_speedup=round(secs / out["inspect_s"], 1))


def case_deepspeed(binary, work, ranks, stage):
    import numpy as np
    import gen_deepspeed_scale as gds
    from gen_scale import llama_tensors

    src = gen(work, f"ds_zero{stage}_w{ranks}", "gen_deepspeed_scale.py", "--ranks", str(ranks), "--stage", str(stage))
    step = os.path.join(src, "global_step1")
    out = dict(format=f"deepspeed-zero{stage}", ranks=ranks, **inspect_row(binary, step))
    baseline(out, TORCH_LOAD_RANKS, step)
    mnt = os.path.join(work, "mnt")
    drop_caches()
    m = Mount(binary, src, mnt)
    try:
        view = os.path.join(mnt, "global_step1")
        t = time.perf_counter()
        os.listdir(view)
        out["first_ls_s"] = round(time.perf_counter() - t, 3)
        path = os.path.join(view, "model.safetensors")
        t = time.perf_counter()
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
            fh.read(1)  # the first tensor byte: rank 0's
        out["first_byte_s"] = round(time.perf_counter() - t, 3)
        out["rank_files_open_after_first_byte"] = open_files_under(m.proc.pid, step)
        t = time.perf_counter()
        with open(path, "rb") as fh:
            data = fh.read()
        secs = time.perf_counter() - t
        out.update(read_s=round(secs, 2), read_MBps=round(len(data) / secs / 1e6),
                   rank_files_open_after_read=open_files_under(m.proc.pid, step), mount_peak_MiB=round(m.peak_rss_mib()))
        shapes = llama_tensors(8, 512, 1408, 4, 64, 8000)  # gen_deepspeed_scale's defaults
        index = {name: p for p, (name, _) in enumerate(shapes)}
        for name, e in header.items():
            if name == "__metadata__":
                continue
            b0, b1 = e["data_offsets"]
            got = np.frombuffer(data, dtype=np.float32, count=(b1 - b0) // 4, offset=8 + n + b0)
            if not np.array_equal(got, gds.expected(shapes, index[name]).ravel()):
                raise SystemExit(f"deepspeed zero{stage} w{ranks}: {name}: view bytes differ from the generator's")
        out["bytes_checked"] = len(data) - 8 - n
    finally:
        m.close()
    log(f"  deepspeed zero{stage} w{ranks}: {json.dumps(out)}")
    return out


def case_hfsharded(binary, work, files):
    src = gen(work, f"hfsharded_w{files}", "gen_hfsharded_scale.py", "--ranks", str(files))
    out = dict(format="hf-sharded", files=files, **inspect_row(binary, src))
    baseline(out, HF_READ_METADATA, src)
    mnt = os.path.join(work, "mnt")
    drop_caches()
    m = Mount(binary, os.path.dirname(src), mnt)  # work/src: each checkpoint is recognised on lookup
    try:
        view = os.path.join(mnt, os.path.basename(src))
        t = time.perf_counter()
        os.listdir(view)
        out["first_ls_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        with open(os.path.join(view, "model.safetensors.index.json"), "rb") as fh:
            fh.read(1)
        out["first_byte_s"] = round(time.perf_counter() - t, 3)
        out["mount_peak_MiB"] = round(m.peak_rss_mib())
    finally:
        m.close()
    log(f"  hf-sharded {files} files: {json.dumps(out)}")
    return out


def case_megatron(binary, work, optim):
    name = f"megatron_moe_w1024{'_optim' if optim else ''}"
    src = gen(work, name, "gen_megatron_moe_scale.py", *(["--optim"] if optim else []))
    out = dict(format="megatron-torch_dist MoE", ranks=1024, optim=optim, **inspect_row(binary, src))
    baseline(out, PICKLE_LOAD, os.path.join(src, ".metadata"))
    mnt = os.path.join(work, "mnt")
    drop_caches()
    m = Mount(binary, os.path.dirname(src), mnt)
    try:
        view = os.path.join(mnt, name)
        t = time.perf_counter()
        names = os.listdir(view)
        out["first_ls_s"] = round(time.perf_counter() - t, 2)
        out["view_files"] = len(names)
        t = time.perf_counter()
        with open(os.path.join(view, "model.safetensors.index.json"), "rb") as fh:
            fh.read(1)
        out["first_byte_s"] = round(time.perf_counter() - t, 3)
        out["counted_view_MiB"] = round(max(v.get("metadata_bytes", 0) for v in m.stats()["views"]) / 2**20, 1)
        out["mount_peak_MiB"] = round(m.peak_rss_mib())
    finally:
        m.close()
    log(f"  {name}: {json.dumps(out)}")
    return out


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
    ap.add_argument("--formats", default="dcp,megatron,deepspeed,hfsharded")
    ap.add_argument("--deepspeed-ranks", default="512")
    ap.add_argument("--hfsharded-files", default="1024")
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    binary = os.path.abspath(a.bin)
    formats = a.formats.split(",")
    adams = {"both": [False, True], "yes": [True], "no": [False]}[a.adam]
    rows = []
    if "dcp" in formats:
        rows += [case(binary, work, int(w), adam) for w in a.ranks.split(",") for adam in adams]
    if "megatron" in formats:
        rows += [case_megatron(binary, work, optim) for optim in (False, True)]
    if "deepspeed" in formats:
        rows += [case_deepspeed(binary, work, int(w), stage) for w in a.deepspeed_ranks.split(",") for stage in (3, 2)]
    if "hfsharded" in formats:
        rows += [case_hfsharded(binary, work, int(w)) for w in a.hfsharded_files.split(",")]
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
