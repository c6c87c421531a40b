"""The scale section of bench.py: checkpoints of many ranks, each opened
by `ckptfs inspect` (wall and CPU seconds, peak RSS) and by a mount (first
`ls` of the view with the mount's CPU for it, first byte of a view file,
the bytes each open view holds as `.ckptfs` counts them, peak RSS), beside
torch's own load of the same metadata in the same run; costs per chunk
(CPU µs of inspect, .metadata bytes, counted bytes per view chunk).

Checkpoints are generated once under WORK/src by gencache.gen (keyed by
the generator's arguments and sources): a second run reuses them; a
changed generator writes anew and removes the stale one.

- dcp: torch DCP of W FSDP ranks (gen_scale.py: Llama-405B shapes, dim-0
  shards, sparse shard files), with and without Adam state; three copies of
  each in one mount, opened in turn. torch's pickle.load of the .metadata
  is run where the file is at most --torch-max-mib (its memory and time
  grow with the file: larger ones approach 8 GB or 3 min on the bench VM,
  BENCHMARKS.md run Y-scale; the row says skipped).
- megatron: Megatron-Core torch_dist of a MoE from 1024 ranks
  (gen_megatron_moe_scale.py, with and without optimizer state; pickle.load
  of its .metadata).
- deepspeed: ZeRO-3 and ZeRO-2 of W ranks (gen_deepspeed_scale.py: real
  bytes, every view byte read through a mount and checked; torch.load of
  every rank file, as zero_to_fp32.py starts; the rank files the mount holds
  open after the first byte and after the whole read).
- hfsharded: safetensors of W files (gen_hfsharded_scale.py: sparse;
  HuggingFaceStorageReader.read_metadata).
- bytes: torch DCP with real bytes from --bytes-ranks (256) ranks
  (gen_scale_bytes.py: a tiny-dims Llama, 39 MB in bf16, saved by dcp.save
  on torch's threaded process group): every byte of every view file read
  cold through a mount (MB/s) and each tensor compared bit for bit with the
  originals, computed in the run; torch's dcp.load of the checkpoint (its
  tensors checked against the same originals) as the baseline.
- dcpsave: the .metadata dcp.save itself writes for the dcp rows' model
  at --dcpsave-ranks (64) ranks (gen_scale_dcpsave.py: threaded ranks,
  meta tensors, no bytes written), opened as the dcp rows are, with
  gen_scale.py's stream of the same shapes beside it in the row.
- legacy: Megatron-LM legacy TP 8 x PP 16 (gen_megatron_legacy_scale.py:
  128 model_optim_rng.pt; torch.load of every rank file; every view tensor
  read through the mount and compared bit for bit with the one torch
  builds from the rank files).

    python e2e/bench/bench_scale.py --bin bin/ckptfs --work .bench [--ranks 64,256,1024,2048] [--adam both|yes|no]
        [--formats dcp,megatron,deepspeed,hfsharded,legacy,bytes,dcpsave] [--deepspeed-ranks 512] [--hfsharded-files 1024]
        [--bytes-ranks 256] [--dcpsave-ranks 64]
        [--torch-max-mib 300]

Prints the rows as JSON on stdout and as a markdown table on stderr.
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable

sys.path.insert(0, HERE)
from bench import Mount, drop_caches, log, read_all, size_of  # noqa: E402
from gencache import gen, made  # noqa: E402
from bench_memory import cpu, rss  # noqa: E402

PICKLE_LOAD = """
import pickle, sys, time
import torch.distributed.checkpoint.metadata, torch.distributed.checkpoint.filesystem
t = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    pickle.load(f)
print(time.perf_counter() - t)
"""

TORCH_LOAD_FILES = """
import glob, os, sys, time, torch
files = sorted(glob.glob(os.path.join(sys.argv[1], sys.argv[2]), recursive=True))
assert files, sys.argv
t = time.perf_counter()
for f in files:
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


class Refused(Exception):
    """A command that exited non-zero: its last line of stderr."""


def timed(cmd):
    """Wall and CPU (user + sys) seconds, peak RSS (MiB) and stdout of a command."""
    r = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M", *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        raise Refused(next((l for l in r.stderr.splitlines() if l.strip() and "exit status" not in l), "?").strip())
    secs, u, sy, kib = r.stderr.strip().splitlines()[-1].split()
    return float(secs), float(u) + float(sy), int(kib) / 1024, r.stdout


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
    """ckptfs inspect of src: tensors, chunks (and those the view shows),
    wall, CPU, peak, CPU µs per chunk."""
    drop_caches()
    try:
        secs, cpu_s, peak, js = timed([binary, "inspect", "--json", src])
    except Refused as e:
        return dict(inspect_error=str(e))
    rep = json.loads(js)
    chunks = sum(t["chunks"] for t in rep["tensors"])
    in_view = {n for v in rep.get("view_tensors", []) for n in v["sources"]}
    view_chunks = sum(t["chunks"] for t in rep["tensors"] if t["name"] in in_view)
    return dict(tensors=len(rep["tensors"]), chunks=chunks, view_chunks=view_chunks, inspect_s=round(secs, 2),
                inspect_cpu_s=round(cpu_s, 2), inspect_peak_MiB=round(peak),
                inspect_us_per_chunk=round(cpu_s * 1e6 / max(chunks, 1), 2))


def baseline(out, script, *args, skip=None):
    """torch's own load: its seconds as the script times them (the import
    of torch left out), the process's wall time and peak RSS; or why not."""
    if skip:
        out["torch_skipped"] = skip
        return
    wall, _, peak, stdout = timed([PY, "-c", script, *args])
    secs = float(stdout.split()[-1])
    out.update(torch_s=round(secs, 2), torch_wall_s=round(wall, 2), torch_peak_MiB=round(peak))
    if "inspect_s" in out:
        out.update(inspect_speedup=round(secs / out["inspect_s"], 1),
                   inspect_memory_ratio=round(out["inspect_peak_MiB"] / peak, 3))


def first_ls(m, view, index="model.safetensors.index.json"):
    """The first ls of a view (wall, the mount's CPU for it) and the first
    byte of a view file after it."""
    c0, t = cpu(m.proc.pid), time.perf_counter()
    names = os.listdir(view)
    ls_s, ls_cpu = time.perf_counter() - t, cpu(m.proc.pid) - c0
    t = time.perf_counter()
    with open(os.path.join(view, index), "rb") as fh:
        fh.read(1)
    return names, round(ls_s, 2), round(ls_cpu, 2), round(time.perf_counter() - t, 3)


def counted(m):
    """The bytes each open view holds, as .ckptfs counts them."""
    return sorted(v.get("metadata_bytes", 0) for v in m.stats()["views"])


def refused(name, out):
    """A row whose checkpoint ckptfs refused: no mount (it refuses the same)."""
    log(f"  {name}: refused: {json.dumps(out)}")
    return out


def case_dcp(binary, work, ranks, adam, torch_max_mib):
    name = f"dcp_w{ranks}{'_adam' if adam else ''}"
    src = gen(work, name, "gen_scale.py", "--ranks", str(ranks), *(["--adam"] if adam else []))
    g = made(src)
    meta = os.path.join(src, ".metadata")
    mib = os.path.getsize(meta) / 2**20
    out = dict(format="dcp", ranks=ranks, optim=adam, gen_s=g["wall_s"], gen_peak_MiB=g["peak_MiB"],
               metadata_MiB=round(mib, 1), load_avg=[round(x, 1) for x in os.getloadavg()], **inspect_row(binary, src))
    baseline(out, PICKLE_LOAD, meta, skip=mib > torch_max_mib and
             f".metadata {mib:.0f} MiB > {torch_max_mib:g} MiB (W=512 with Adam, 216 MiB: 3.8 GiB, 27-122 s here)")
    if "inspect_error" in out:
        return refused(name, out)
    out["metadata_B_per_chunk"] = round(os.path.getsize(meta) / out["chunks"])

    # Three copies in one mount: each view opened in turn (ls, first byte).
    base = copies(src, 3)
    mnt = os.path.join(work, "mnt")
    drop_caches()
    m = Mount(binary, base, mnt)
    try:
        rows = [first_ls(m, os.path.join(mnt, f"c{i}"))[1:] for i in range(3)]
        c = counted(m)
        out.update(first_ls_s=[r[0] for r in rows], first_ls_cpu_s=[r[1] for r in rows],
                   first_byte_s=[r[2] for r in rows], counted_per_view_MiB=[round(b / 2**20, 1) for b in c],
                   counted_B_per_view_chunk=round(c[-1] / max(out["view_chunks"], 1)),
                   metadata_budget_MiB=round(m.stats()["metadata_budget"] / 2**20),
                   mount_rss_3_views_MiB=round(rss(m.proc.pid)), mount_peak_MiB=round(m.peak_rss_mib()))
    finally:
        m.close()
    out["load_avg"] += [round(x, 1) for x in os.getloadavg()]
    log(f"  {name}: {json.dumps(out)}")
    return out


def mounted_view(binary, work, out, root, view, index="model.safetensors.index.json", check=None):
    """A mount of root: first ls of root/view, first byte, counted bytes,
    peak; then check(view directory), if given, while it is mounted."""
    mnt = os.path.join(work, "mnt")
    drop_caches()
    m = Mount(binary, root, mnt)
    try:
        names, ls_s, ls_cpu, byte_s = first_ls(m, os.path.join(mnt, view), index)
        c = counted(m)
        out.update(view_files=len(names), first_ls_s=ls_s, first_ls_cpu_s=ls_cpu, first_byte_s=byte_s,
                   counted_per_view_MiB=[round(b / 2**20, 1) for b in c],
                   counted_B_per_view_chunk=round(c[-1] / max(out["view_chunks"], 1)) if c else None,
                   mount_peak_MiB=round(m.peak_rss_mib()))
        if check:
            check(os.path.join(mnt, view))
            out["mount_peak_after_check_MiB"] = round(m.peak_rss_mib())
    finally:
        m.close()


def legacy_expected(it):
    """The view of a Megatron legacy checkpoint (the megatron-gpt mapping's
    HF Llama names) built by torch from its rank files: TP slices
    concatenated (column-parallel on dim 0, row-parallel on dim 1,
    linear_fc1 as [gate_r; up_r] per rank), the fused QKV split per query
    group, the padded vocabulary cut, each stage's layers numbered on."""
    import glob

    import torch

    files = {}
    for f in glob.glob(os.path.join(it, "mp_rank_*", "model_optim_rng.pt")):
        tp, pp = map(int, os.path.basename(os.path.dirname(f))[len("mp_rank_"):].split("_"))
        files[tp, pp] = torch.load(f, map_location="cpu", weights_only=False)
    args = files[0, 0]["args"]
    tp, pp, layers = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.num_layers
    per, d, hpg = layers // pp, args.kv_channels, args.num_attention_heads // args.num_query_groups

    def cat(stage, name, dim):
        return torch.cat([files[r, stage]["model"][name] for r in range(tp)], dim)

    out = {"model.embed_tokens.weight": cat(0, "embedding.word_embeddings.weight", 0)[:args.vocab_size],
           "lm_head.weight": cat(pp - 1, "output_layer.weight", 0)[:args.vocab_size],
           "model.norm.weight": files[0, pp - 1]["model"]["decoder.final_layernorm.weight"]}
    for layer in range(layers):
        s, p, h = layer // per, f"decoder.layers.{layer % per}.", f"model.layers.{layer}."
        m0 = files[0, s]["model"]
        qkv = cat(s, p + "self_attention.linear_qkv.weight", 0).view(args.num_query_groups, (hpg + 2) * d, -1)
        fc1 = [files[r, s]["model"][p + "mlp.linear_fc1.weight"] for r in range(tp)]
        out.update({
            h + "input_layernorm.weight": m0[p + "input_layernorm.weight"],
            h + "post_attention_layernorm.weight": m0[p + "pre_mlp_layernorm.weight"],
            h + "self_attn.q_proj.weight": qkv[:, :hpg * d].reshape(-1, args.hidden_size),
            h + "self_attn.k_proj.weight": qkv[:, hpg * d:(hpg + 1) * d].reshape(-1, args.hidden_size),
            h + "self_attn.v_proj.weight": qkv[:, (hpg + 1) * d:].reshape(-1, args.hidden_size),
            h + "self_attn.o_proj.weight": cat(s, p + "self_attention.linear_proj.weight", 1),
            h + "mlp.gate_proj.weight": torch.cat([t[:len(t) // 2] for t in fc1]),
            h + "mlp.up_proj.weight": torch.cat([t[len(t) // 2:] for t in fc1]),
            h + "mlp.down_proj.weight": cat(s, p + "mlp.linear_fc2.weight", 1)})
    return out


def check_view(view, expected):
    """Every tensor of the view's safetensors files equals expected's, bit
    for bit, and the names are the same; returns the bytes compared."""
    import torch
    from safetensors import safe_open

    seen, n, bad = set(), 0, None
    for f in sorted(os.listdir(view)):
        if not f.endswith(".safetensors") or bad:
            continue
        with safe_open(os.path.join(view, f), "pt") as st:
            for k in st.keys():
                got, want = st.get_tensor(k), expected.get(k)
                if want is None or got.dtype != want.dtype or got.shape != want.shape or not torch.equal(
                        got.view(torch.uint8), want.contiguous().view(torch.uint8)):
                    bad = f"{view}/{f}: {k}: differs from the tensor torch built from the rank files"
                    break
                seen.add(k)
                n += got.numel() * got.element_size()
        got = want = None  # nothing of the view held: the mount must unmount
    if bad:
        raise SystemExit(bad)
    if seen != set(expected):
        raise SystemExit(f"{view}: view names differ from torch's: missing {sorted(set(expected) - seen)[:5]}, "
                         f"extra {sorted(seen - set(expected))[:5]}")
    return n


def case_megatron(binary, work, optim):
    name = f"megatron_moe_w1024{'_optim' if optim else ''}"
    src = gen(work, name, "gen_megatron_moe_scale.py", *(["--optim"] if optim else []))
    g = made(src)
    meta = os.path.join(src, ".metadata")
    out = dict(format="megatron-torch_dist MoE", ranks=1024, optim=optim, gen_s=g["wall_s"],
               metadata_MiB=round(os.path.getsize(meta) / 2**20, 1), load_avg=[round(x, 1) for x in os.getloadavg()],
               **inspect_row(binary, src))
    baseline(out, PICKLE_LOAD, meta)
    if "inspect_error" in out:
        return refused(name, out)
    out["metadata_B_per_chunk"] = round(os.path.getsize(meta) / out["chunks"])
    mounted_view(binary, work, out, os.path.dirname(src), os.path.basename(src))
    log(f"  {name}: {json.dumps(out)}")
    return out


def case_legacy(binary, work):
    name = "megatron_legacy_tp8pp16"
    src = gen(work, name, "gen_megatron_legacy_scale.py")
    g = made(src)
    it = os.path.join(src, "iter_0000001")
    out = dict(format="megatron-legacy TP8xPP16", ranks=128, optim=False, gen_s=g["wall_s"],
               load_avg=[round(x, 1) for x in os.getloadavg()], **inspect_row(binary, it))
    baseline(out, TORCH_LOAD_FILES, it, "mp_rank_*/model_optim_rng.pt")
    if "inspect_error" in out:
        return refused(name, out)
    expected = legacy_expected(it)

    def check(view):
        t = time.perf_counter()
        out["bytes_checked"] = check_view(view, expected)
        out["read_check_s"] = round(time.perf_counter() - t, 2)

    mounted_view(binary, work, out, src, "iter_0000001", check=check)
    log(f"  {name}: {json.dumps(out)}")
    return out


def case_deepspeed(binary, work, ranks, stage):
    import numpy as np
    import gen_deepspeed_scale as gds
    from gen_scale import llama_tensors

    src = gen(work, f"ds_zero{stage}_w{ranks}", "gen_deepspeed_scale.py", "--ranks", str(ranks),
              "--stage", str(stage))
    g = made(src)
    step = os.path.join(src, "global_step1")
    out = dict(format=f"deepspeed-zero{stage}", ranks=ranks, optim=True, gen_s=g["wall_s"],
               load_avg=[round(x, 1) for x in os.getloadavg()], **inspect_row(binary, step))
    baseline(out, TORCH_LOAD_FILES, step, "*_states.pt")
    if "inspect_error" in out:
        return refused(f"ds_zero{stage}_w{ranks}", out)
    mnt = os.path.join(work, "mnt")
    drop_caches()
    m = Mount(binary, src, mnt)
    try:
        view = os.path.join(mnt, "global_step1")
        c0, t = cpu(m.proc.pid), time.perf_counter()
        os.listdir(view)
        out["first_ls_s"] = round(time.perf_counter() - t, 3)
        out["first_ls_cpu_s"] = round(cpu(m.proc.pid) - c0, 2)
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
        c = counted(m)
        out.update(read_s=round(secs, 2), read_MBps=round(len(data) / secs / 1e6),
                   rank_files_open_after_read=open_files_under(m.proc.pid, step),
                   counted_per_view_MiB=[round(b / 2**20, 1) for b in c],
                   counted_B_per_view_chunk=round(c[-1] / max(out["view_chunks"], 1)) if c else None,
                   mount_peak_MiB=round(m.peak_rss_mib()))
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
    g = made(src)
    out = dict(format="hf-sharded", ranks=files, optim=False, gen_s=g["wall_s"],
               load_avg=[round(x, 1) for x in os.getloadavg()], **inspect_row(binary, src))
    baseline(out, HF_READ_METADATA, src)
    if "inspect_error" in out:
        return refused(f"hfsharded_w{files}", out)
    mounted_view(binary, work, out, os.path.dirname(src), os.path.basename(src))
    log(f"  hf-sharded {files} files: {json.dumps(out)}")
    return out


DCP_LOAD = """
import sys, time, torch
import torch.distributed.checkpoint as dcp
sys.path.insert(0, sys.argv[2])
import gen_scale_bytes as g
a = g.args([sys.argv[1], *sys.argv[3:]])
want = g.tensors(a)
state = {k: torch.empty_like(v) for k, v in want.items()}
t = time.perf_counter()
dcp.load(state, checkpoint_id=sys.argv[1], no_dist=True)
secs = time.perf_counter() - t
bad = [k for k in want if not torch.equal(state[k].view(torch.uint8), want[k].view(torch.uint8))]
assert not bad, f"torch's dcp.load differs from the generator's tensors: {bad[:5]}"
print(secs)
"""


def read_view(view):
    """Every byte of every file of a view, in name order, with 1 MiB reads:
    name -> bytes, and the seconds of the reads."""
    data, t = {}, time.perf_counter()
    for f in sorted(os.listdir(view)):
        with open(os.path.join(view, f), "rb", buffering=0) as fh:
            parts = []
            while b := fh.read(1 << 20):
                parts.append(b)
        data[f] = b"".join(parts)
    return data, time.perf_counter() - t


def check_bytes(where, data, expected):
    """The view's safetensors files (as read) hold expected's tensors, bit
    for bit, each once, as the index maps them; returns the tensor bytes."""
    import torch
    from safetensors.torch import load

    index = json.loads(data["model.safetensors.index.json"])["weight_map"]
    if set(index) != set(expected):
        raise SystemExit(f"{where}: the index names differ from the originals': missing "
                         f"{sorted(set(expected) - set(index))[:5]}, extra {sorted(set(index) - set(expected))[:5]}")
    seen, n = set(), 0
    for f in sorted(k for k in data if k.endswith(".safetensors")):
        for k, got in load(data[f]).items():
            want = expected.get(k)
            if index.get(k) != f or k in seen:
                raise SystemExit(f"{where}/{f}: {k}: not where the index puts it, or twice")
            if want is None or got.dtype != want.dtype or got.shape != want.shape or not torch.equal(
                    got.view(torch.uint8), want.view(torch.uint8)):
                raise SystemExit(f"{where}/{f}: {k}: differs from the original tensor")
            seen.add(k)
            n += got.numel() * got.element_size()
    if seen != set(expected):
        raise SystemExit(f"{where}: tensors not in any view file: {sorted(set(expected) - seen)[:5]}")
    return n


def case_bytes(binary, work, ranks):
    """torch DCP with real bytes from W ranks (gen_scale_bytes.py: dcp.save
    on torch's threaded process group): cold (caches dropped, a fresh
    mount) first ls, first byte, every byte of every view file read and
    each tensor compared bit for bit with the generator's originals,
    computed here; torch's dcp.load of the same checkpoint (checked
    against them too) as the baseline."""
    import gen_scale_bytes as gsb

    name = f"dcp_bytes_w{ranks}"
    argv = ["--ranks", str(ranks)]
    src = gen(work, name, "gen_scale_bytes.py", *argv)
    g = made(src)
    out = dict(format="dcp real bytes", ranks=ranks, optim=False, gen_s=g["wall_s"], gen_peak_MiB=g["peak_MiB"],
               metadata_MiB=round(os.path.getsize(os.path.join(src, ".metadata")) / 2**20, 2),
               load_avg=[round(x, 1) for x in os.getloadavg()], **inspect_row(binary, src))
    if "inspect_error" in out:
        return refused(name, out)
    out["metadata_B_per_chunk"] = round(os.path.getsize(os.path.join(src, ".metadata")) / out["chunks"])
    drop_caches()
    wall, _, peak, secs = timed([PY, "-c", DCP_LOAD, src, HERE, *argv])
    out.update(torch_load_s=round(float(secs.split()[-1]), 2), torch_load_wall_s=round(wall, 2),
               torch_load_peak_MiB=round(peak), torch_skipped="dcp.load of the tensors: the read table")
    drop_caches()
    shards = sorted(glob.glob(os.path.join(src, "*.distcp")))
    secs = read_all(shards)
    out.update(shards_read_s=round(secs, 2), shards_MBps=round(size_of(shards) / secs / 1e6))
    expected = gsb.tensors(gsb.args([src, *argv]))

    def check(view):
        drop_caches()  # the first ls and byte read the index and headers: the rest still cold
        data, secs = read_view(view)
        nbytes = sum(map(len, data.values()))
        out.update(read_s=round(secs, 2), read_MBps=round(nbytes / secs / 1e6), view_bytes=nbytes,
                   read_vs_shards=round(out["shards_read_s"] / secs, 2))
        t = time.perf_counter()
        out["bytes_checked"] = check_bytes(view, data, expected)
        out["check_s"] = round(time.perf_counter() - t, 2)

    mounted_view(binary, work, out, os.path.dirname(src), os.path.basename(src), check=check)
    log(f"  {name}: {json.dumps(out)}")
    return out


def case_dcpsave(binary, work, ranks):
    """The .metadata dcp.save itself writes for gen_scale.py's model at W
    ranks (gen_scale_dcpsave.py: threaded ranks, meta tensors, no bytes),
    opened as the dcp rows are, beside gen_scale.py's stream of the same
    shapes (its bytes and inspect CPU in the same row): how far the
    generator the other rows use is from what torch writes."""
    name = f"dcpsave_w{ranks}"
    src = gen(work, name, "gen_scale_dcpsave.py", "--ranks", str(ranks))
    g = made(src)
    meta = os.path.join(src, ".metadata")
    out = dict(format="dcp, dcp.save's own .metadata", ranks=ranks, optim=False, gen_s=g["wall_s"],
               gen_peak_MiB=g["peak_MiB"], metadata_MiB=round(os.path.getsize(meta) / 2**20, 1),
               load_avg=[round(x, 1) for x in os.getloadavg()], **inspect_row(binary, src))
    baseline(out, PICKLE_LOAD, meta)
    if "inspect_error" in out:
        return refused(name, out)
    out["metadata_B_per_chunk"] = round(os.path.getsize(meta) / out["chunks"])
    ours = gen(work, f"dcp_w{ranks}", "gen_scale.py", "--ranks", str(ranks))
    mine = inspect_row(binary, ours)
    out.update(gen_scale_chunks=mine.get("chunks"), gen_scale_inspect_cpu_s=mine.get("inspect_cpu_s"),
               gen_scale_metadata_MiB=round(os.path.getsize(os.path.join(ours, ".metadata")) / 2**20, 1))
    mounted_view(binary, work, out, os.path.dirname(src), os.path.basename(src))
    log(f"  {name}: {json.dumps(out)}")
    return out


def first(v):
    return v[0] if isinstance(v, list) else v


def table(rows):
    """The rows as BENCHMARKS.md's scaling table."""
    head = ("| format | W | optim | chunks (view) | .metadata | inspect wall / CPU / peak | CPU µs per chunk "
            "| torch's load: s / peak (× inspect's wall) | first `ls` (mount CPU) | first byte | counted per view (B per view chunk) "
            "| mount peak |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "inspect_error" in r:
            lines.append(f"| {r['format']} | {r['ranks']} | {'yes' if r['optim'] else 'no'} | – "
                         f"| {r.get('metadata_MiB', '–')} MiB | refused: `{r['inspect_error']}` |" + " – |" * 6)
            continue
        if "torch_s" in r:
            torch_ = f"{r['torch_s']} s / {r['torch_peak_MiB']} MiB ({r['inspect_speedup']}x)"
        else:
            torch_ = "skipped: " + r.get("torch_skipped", "")
        ls = r.get("first_ls_s")
        ls = "–" if ls is None else (
            f"{'/'.join(str(x) for x in ls)} s ({'/'.join(str(x) for x in r['first_ls_cpu_s'])})" if isinstance(ls, list)
            else f"{ls} s ({r['first_ls_cpu_s']})")
        per_view = r.get("counted_per_view_MiB") or []
        meta = f"{r['metadata_MiB']} MiB ({r['metadata_B_per_chunk']} B/chunk)" if "metadata_MiB" in r else "–"
        lines.append(
            f"| {r['format']} | {r['ranks']} | {'yes' if r['optim'] else 'no'} | {r['chunks']} ({r['view_chunks']}) "
            f"| {meta} | {r['inspect_s']} s / {r['inspect_cpu_s']} s / {r['inspect_peak_MiB']} MiB "
            f"| {r['inspect_us_per_chunk']} | {torch_} | {ls} | {first(r.get('first_byte_s', '–'))} s "
            f"| {per_view[-1] if per_view else '–'} MiB ({r.get('counted_B_per_view_chunk')}) "
            f"| {r.get('mount_peak_MiB', '–')} MiB |")
    pairs = [r for r in rows if "gen_scale_metadata_MiB" in r]
    if pairs:
        lines += ["", "| W | chunks: dcp.save / gen_scale | .metadata: dcp.save / gen_scale | inspect CPU: dcp.save / gen_scale |",
                  "|---|---|---|---|"]
        lines += [f"| {r['ranks']} | {r['chunks']} / {r['gen_scale_chunks']} | {r['metadata_MiB']} / "
                  f"{r['gen_scale_metadata_MiB']} MiB | {r['inspect_cpu_s']} / {r['gen_scale_inspect_cpu_s']} s |" for r in pairs]
    checked = [r for r in rows if "view_bytes" in r]
    if checked:
        lines += ["", "| format | W | view bytes read, each tensor compared | cold read: s / MB/s | shards' cold read(2): s / MB/s (the view's speed, × the shards') | compare s "
                      "| torch's dcp.load: s / peak | mount peak after the read |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['format']} | {r['ranks']} | {r['view_bytes']} ({r['bytes_checked']} tensor bytes) "
                  f"| {r['read_s']} s / {r['read_MBps']} MB/s | {r['shards_read_s']} s / {r['shards_MBps']} MB/s "
                  f"({r['read_vs_shards']}x) | {r['check_s']} s "
                  f"| {r['torch_load_s']} s / {r['torch_load_peak_MiB']} MiB | {r['mount_peak_after_check_MiB']} MiB |"
                  for r in checked]
    return "\n".join(lines)


def fit(rows, x, y):
    """Least squares y = a + b·x over rows (a, b, R²), x and y functions of a row."""
    pts = [(x(r), y(r)) for r in rows]
    n = len(pts)
    if n < 2:
        return None
    mx, my = sum(p[0] for p in pts) / n, sum(p[1] for p in pts) / n
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    if sxx == 0:  # one size only
        return None
    sxy = sum((p[0] - mx) * (p[1] - my) for p in pts)
    b = sxy / sxx
    a = my - b * mx
    ss = sum((p[1] - my) ** 2 for p in pts)
    r2 = 1 - sum((p[1] - a - b * p[0]) ** 2 for p in pts) / ss if ss else 1.0
    return a, b, r2


def constants(rows):
    """The DCP rows' cost per chunk, fitted: inspect CPU and the first ls's
    mount CPU per chunk, counted bytes per view chunk, .metadata bytes per chunk."""
    dcp = [r for r in rows if r["format"] == "dcp" and "inspect_error" not in r]
    out = []
    for what, x, y, unit, scale in (
            ("inspect CPU", lambda r: r["chunks"], lambda r: r["inspect_cpu_s"], "µs per chunk", 1e6),
            ("first ls, mount CPU (first view)", lambda r: r["chunks"], lambda r: r["first_ls_cpu_s"][0],
             "µs per chunk", 1e6),
            ("counted per view", lambda r: r["view_chunks"], lambda r: r["counted_per_view_MiB"][-1] * 2**20,
             "B per view chunk", 1),
            ("inspect peak RSS", lambda r: r["chunks"], lambda r: r["inspect_peak_MiB"] * 2**20, "B per chunk", 1),
            (".metadata", lambda r: r["chunks"], lambda r: r["metadata_MiB"] * 2**20, "B per chunk", 1)):
        f = fit(dcp, x, y)
        if f:
            a, b, r2 = f
            base = f"{a:.2f} s" if scale != 1 else f"{a / 2**20:.1f} MiB"
            out.append(f"- {what}: {base} + {b * scale:.2f} {unit} (R² {r2:.4f}, {len(dcp)} rows)")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", default=".bench")
    ap.add_argument("--ranks", default="64,256,1024,2048", help="the DCP world sizes")
    ap.add_argument("--adam", default="both", choices=["both", "yes", "no"])
    ap.add_argument("--formats", default="dcp,megatron,deepspeed,hfsharded,legacy,bytes,dcpsave")
    ap.add_argument("--deepspeed-ranks", default="512")
    ap.add_argument("--hfsharded-files", default="1024")
    ap.add_argument("--bytes-ranks", default="256", help="the world sizes of the DCP with real bytes")
    ap.add_argument("--dcpsave-ranks", default="64", help="the world sizes of dcp.save's own .metadata")
    ap.add_argument("--torch-max-mib", type=float, default=300,
                    help="torch's pickle.load of a DCP .metadata larger than this is skipped")
    ap.add_argument("--table", help="print the table and constants of a saved JSON output, run nothing")
    a = ap.parse_args()
    if a.table:
        with open(a.table) as f:
            rows = json.load(f)
        print(table(rows) + "\n\n" + constants(rows))
        return
    work = os.path.abspath(a.work)
    binary = os.path.abspath(a.bin)
    formats = a.formats.split(",")
    adams = {"both": [False, True], "yes": [True], "no": [False]}[a.adam]
    rows = []
    if "dcp" in formats:
        rows += [case_dcp(binary, work, int(w), adam, a.torch_max_mib) for w in a.ranks.split(",") for adam in adams]
    if "megatron" in formats:
        rows += [case_megatron(binary, work, optim) for optim in (False, True)]
    if "legacy" in formats:
        rows.append(case_legacy(binary, work))
    if "deepspeed" in formats:
        rows += [case_deepspeed(binary, work, int(w), stage) for w in a.deepspeed_ranks.split(",") for stage in (3, 2)]
    if "hfsharded" in formats:
        rows += [case_hfsharded(binary, work, int(w)) for w in a.hfsharded_files.split(",")]
    if "bytes" in formats:
        rows += [case_bytes(binary, work, int(w)) for w in a.bytes_ranks.split(",")]
    if "dcpsave" in formats:
        rows += [case_dcpsave(binary, work, int(w)) for w in a.dcpsave_ranks.split(",")]
    log(table(rows) + "\n\n" + constants(rows))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
