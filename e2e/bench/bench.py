"""ckptfs benchmarks: every figure is a ratio to a baseline measured in the
same run, on the same data and disk, interleaved with it (A, B, C, A, B, C,
...), reduced to the median, and printed against its target.

    python e2e/bench/bench.py --bin bin/ckptfs [--repeat 3] [--only load,seq,...] [--json out.json]

"Cold" means `sync; echo 3 > /proc/sys/vm/drop_caches` (root) and a fresh
mount before each timed run. Sections:

  load    from_pretrained + touching every weight, cold and warm, through the
          mount vs a physical consolidated copy vs what users run today
          (torch's consolidate_safetensors_files + load; dcp_to_torch_save +
          save_pretrained + load); cat of the view vs cat of the shards; peak
          RSS; page-cache growth (Cached) of a load
  seq     cold sequential read of views sharded on dim 0, on dim 1, and of a
          mapped view (Megatron-style stacked, fused QKV) vs read(2) of the
          shards (the warm re-read is in load)
  chunks  time to mount and list a checkpoint of 100k chunks
  verify  export with --verify vs without
  write   cp / save_pretrained into a --rw mount vs cp + fsync, world sizes 1, 4, 8
  rss     peak RSS of a mount with a 64 MiB cache under 1, 16, 64 random readers
  tmpfs   the byte path with no disk: shards in /dev/shm, a cold read of the view vs
          read(2) of the shards vs a null go-fuse server (e2e/bench/nullfs, built in the
          run) serving a file of the same size with go-fuse's defaults, and two that cache
          attributes as the mount does: a static buffer, and the view's bytes pread from
          one tmpfs file; mount CPU seconds per GB; 8 processes
          reading disjoint ranges of the view vs one; two mapped views vs the same bytes
          unmapped (--map none): Megatron-style (stacked, fused QKV) and torchtitan's
          Llama names (q/k rows RoPE-permuted)
  transport  the FUSE transport alone: a cold read of a 1 GB null server's file through
          go-fuse (nullfs) vs e2e/bench/rawfuse on one /dev/fuse fd, on cloned fds
          (FUSE_DEV_IOC_CLONE) and over io_uring (where the kernel has it; queue threads
          pinned to their CPUs or not), all caching attributes, at 128 KiB and 8 MiB
          read-ahead; GB/s, server CPU per GB, ratio to go-fuse
  large   what a user of a GPU node sees, at Llama 3 sizes (--preset llama3-3b | llama3-8b, bf16,
          saved by dcp.save from 8 gloo ranks; not in the default set): cold
          from_pretrained(dtype=bf16, device_map="cuda" where there is a GPU) through the mount vs
          from a physical copy (ckptfs export) vs torch's dcp.load into a model, logits compared
          bitwise; cold cat of the view vs the shards; 8 processes reading disjoint ranges of the
          view vs the copy; with --lever FLAGS, each mount case also with those mount flags
  scale   checkpoints of many ranks (e2e/bench/bench_scale.py): inspect, first ls, first byte,
          resident per view and torch's own load of the same metadata, per chunk; torch DCP at
          --scale-ranks (default 64,256,1024, with and without Adam; 2048 on request: its
          generation takes 3 min and the mount minutes here), Megatron torch_dist MoE of 1024
          ranks, Megatron legacy TP8xPP16, DeepSpeed ZeRO-3/2 of 512 ranks, HF-sharded of 1024
          files; torch DCP with real bytes saved by dcp.save from 256 ranks, every view byte read
          cold and each tensor compared bit for bit with the originals; dcp.save's own .metadata of
          the dcp rows' model at 64 ranks beside the generator's

Every section's checkpoints are generated once under WORK/src (gencache.py: keyed by the
generator's arguments and sources, atomic).
"""

import argparse
import functools
import glob
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable

sys.path.insert(0, HERE)
from gencache import gen  # noqa: E402,F401  (the sections' and bench_*.py's generate-once)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def run(cmd, **kw):
    """Run cmd; return (seconds, peak RSS MiB, system CPU seconds) of that process."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, **kw)
    _, status, ru = os.wait4(p.pid, 0)
    secs = time.perf_counter() - t
    if status != 0:
        raise RuntimeError(f"{cmd} failed with status {status}")
    return secs, ru.ru_maxrss / 1024, ru.ru_stime


def read_all(paths, bs=1 << 20):
    """Sequentially read files with 1 MiB read(2) calls; return seconds."""
    buf = bytearray(bs)
    t = time.perf_counter()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            while os.readv(fd, [buf]):
                pass
        finally:
            os.close(fd)
    return time.perf_counter() - t


def size_of(paths):
    return sum(os.path.getsize(p) for p in paths)


def files(d, pattern):
    return sorted(glob.glob(os.path.join(d, pattern)))


def interleaved(cases, repeat):
    """Run each case once per round for repeat rounds, each round starting one
    case later (on this VM the run after a heavy one, or after a pause, pays
    for faulting fresh memory in; a fixed order charges it to the same case
    every round); return name -> median seconds (and name -> all runs)."""
    runs = {name: [] for name in cases}
    names = list(cases)
    for r in range(repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runs[name].append(cases[name]())
            log(f"  round {r + 1}/{repeat} {name}: {runs[name][-1]:.2f} s")
    return {n: statistics.median(v) for n, v in runs.items()}, runs


class Mount:
    """A `ckptfs mount` process; ready when its stats file appears."""

    def __init__(self, binary, src, mnt, *flags, env=None, stderr=subprocess.DEVNULL):
        os.makedirs(mnt, exist_ok=True)
        self.mnt = mnt
        self.proc = subprocess.Popen([binary, "mount", *flags, src, mnt], stderr=stderr,
                                     env=None if env is None else {**os.environ, **env})
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(mnt, ".ckptfs")):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("mount failed")
            time.sleep(0.02)

    def peak_rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024

    def stats(self):
        with open(os.path.join(self.mnt, ".ckptfs")) as f:
            return json.load(f)

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


# from_pretrained may leave weights mapped and unread until first use, so
# the timed step also touches every page of every parameter (one element
# per 4 KiB), as the first forward pass would. Imports are not timed.
# It also prints how much the page cache grew over the timed step: measured
# from outside, the growth would include the pages of torch's and
# transformers' own libraries, 0.55x the model here.
LOAD = """
import sys, time, torch
from transformers import AutoModelForCausalLM
def cached():
    with open("/proc/meminfo") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("Cached:")) * 1024
before = cached()
t = time.perf_counter()
m = AutoModelForCausalLM.from_pretrained(sys.argv[1])
torch.cat([p.detach().reshape(-1)[::1024].float() for p in m.parameters()]).sum()
secs = time.perf_counter() - t
print("cached_growth", cached() - before)
print(secs)
"""

# What users run today on HF-sharded output (NeMo, torchtitan, torch's HF
# writer): torch's consolidation, then a load of what it wrote.
CONSOLIDATE = """
import glob, json, os, shutil, sys, time, torch
from safetensors import safe_open
from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files
from transformers import AutoModelForCausalLM
src, out = sys.argv[1], sys.argv[2]
t = time.perf_counter()
# Every tensor into one output file, as the writer's own consolidation does
# when no mapping was saved.
names = set()
for f in glob.glob(os.path.join(src, "*.safetensors")):
    with safe_open(f, "pt") as s:
        names.update(s.keys())
os.makedirs(out, exist_ok=True)
consolidate_safetensors_files(src, out, fqn_to_index_mapping=dict.fromkeys(names, 1))
shutil.copy(os.path.join(src, "config.json"), out)
m = AutoModelForCausalLM.from_pretrained(out)
torch.cat([p.detach().reshape(-1)[::1024].float() for p in m.parameters()]).sum()
print(time.perf_counter() - t)
"""

# ... and on DCP: torch's own reader into a torch.save file, then
# save_pretrained, then a load.
DCP_CONVERT = """
import os, sys, time, torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import AutoConfig, AutoModelForCausalLM
src, out = sys.argv[1], sys.argv[2]
t = time.perf_counter()
dcp_to_torch_save(src, out + ".pt")
sd = torch.load(out + ".pt", weights_only=True, mmap=True)
cfg = AutoConfig.from_pretrained(src)
with torch.device("meta"):
    m = AutoModelForCausalLM.from_config(cfg)
m.load_state_dict(sd, assign=True)
m.save_pretrained(out)
del m, sd
os.remove(out + ".pt")
m = AutoModelForCausalLM.from_pretrained(out)
torch.cat([p.detach().reshape(-1)[::1024].float() for p in m.parameters()]).sum()
print(time.perf_counter() - t)
"""


def cold_cat(paths):
    """Seconds to read paths after dropping the page cache."""
    drop_caches()
    return read_all(paths)


def cold_cat_view(binary, ckpt, mnt, *flags):
    """Seconds to read the view files of ckpt through a fresh mount of its
    parent (with mount flags), after dropping the page cache."""
    drop_caches()
    m = Mount(binary, os.path.dirname(ckpt), mnt, *flags)
    try:
        return read_all(files(os.path.join(mnt, os.path.basename(ckpt)), "*.safetensors"))
    finally:
        m.close()


def python_seconds(script, *args):
    return float(python_lines(script, *args)[-1])


def python_lines(script, *args):
    r = subprocess.run([PY, "-c", script, *map(str, args)], check=True, capture_output=True, text=True)
    return r.stdout.strip().splitlines()


def timed_load(model):
    """Seconds of a LOAD of model, and the bytes the page cache grew by meanwhile."""
    lines = python_lines(LOAD, model)
    growth = next(int(l.split()[1]) for l in lines if l.startswith("cached_growth "))
    return float(lines[-1]), growth


def bench_load(binary, work, repeat):
    """The table of issue 11: cold and warm loads, cat, both torch converters."""
    dcp_src = gen(work, "llama", "gen_llama.py")
    hf_src = gen(work, "llama-hf", "gen_llama.py", "--format", "hf")
    shutil.copy(os.path.join(dcp_src, "config.json"), hf_src)
    model_bytes = size_of(files(dcp_src, "*.distcp"))
    copy = os.path.join(work, "copy-llama")
    if not os.path.exists(os.path.join(copy, "config.json")):
        subprocess.run([binary, "export", "--quiet", dcp_src, copy], check=True)
    mnt = os.path.join(work, "mnt")
    scratch = os.path.join(work, "scratch")
    extra = {"mount_rss_MiB": [], "block_cache_mount_rss_MiB": [], "cached_growth": [], "copy_cached_growth": [], "hf_mount_rss_MiB": [],
             "plain_mount_rss_MiB": []}

    cat_shards = functools.partial(cold_cat, files(dcp_src, "*.distcp"))
    cat_mount = functools.partial(cold_cat_view, binary, dcp_src, mnt)
    # The FUSE floor: the physical copy served through a mount as a plain HF
    # directory (one pread per request, no gather).
    cat_fuse_plain = functools.partial(cold_cat_view, binary, copy, mnt)
    cat_copy = functools.partial(cold_cat, files(copy, "*.safetensors"))

    def load_copy():
        drop_caches()
        secs, growth = timed_load(copy)
        extra["copy_cached_growth"].append(growth / model_bytes)
        return secs

    def load_mount(src, rss, cached=None, *flags):
        """A cold load through a fresh mount of src's parent (with mount flags)."""
        def go():
            drop_caches()
            m = Mount(binary, os.path.dirname(src), mnt, *flags)
            try:
                secs, growth = timed_load(os.path.join(mnt, os.path.basename(src)))
                if cached is not None:
                    cached.append(growth / model_bytes)
                rss.append(m.peak_rss_mib())
                return secs
            finally:
                m.close()
        return go

    def convert_and_load(script, src):
        """A cold run of a torch converter into scratch, then a load."""
        def go():
            shutil.rmtree(scratch, ignore_errors=True)
            drop_caches()
            try:
                return python_seconds(script, src, scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        return go

    cold, runs = interleaved({"cat_shards": cat_shards, "cat_mount": cat_mount, "cat_copy": cat_copy,
                              "cat_fuse_plain": cat_fuse_plain, "load_copy": load_copy,
                              "load_mount": load_mount(dcp_src, extra["mount_rss_MiB"], extra["cached_growth"]),
                              "load_mount_hf": load_mount(hf_src, extra["hf_mount_rss_MiB"]),
                              "load_mount_block_cache": load_mount(dcp_src, extra["block_cache_mount_rss_MiB"], None,
                                                                   "--direct-reads=false"),
                              "load_fuse_plain": load_mount(copy, extra["plain_mount_rss_MiB"]),
                              "consolidate_and_load": convert_and_load(CONSOLIDATE, hf_src),
                              "dcp_convert_and_load": convert_and_load(DCP_CONVERT, dcp_src)}, repeat)

    # Warm: the same mount (its view pages cached) vs the copy, cached.
    m = Mount(binary, os.path.dirname(dcp_src), mnt)
    try:
        view = files(os.path.join(mnt, "llama"), "*.safetensors")
        plain = files(copy, "*.safetensors")
        read_all(view), read_all(plain)
        python_seconds(LOAD, os.path.join(mnt, "llama")), python_seconds(LOAD, copy)
        warm, warm_runs = interleaved({"cat_plain_warm": lambda: read_all(plain),
                                       "cat_mount_warm": lambda: read_all(view),
                                       "load_copy_warm": lambda: python_seconds(LOAD, copy),
                                       "load_mount_warm": lambda: python_seconds(LOAD, os.path.join(mnt, "llama"))},
                                      repeat)
    finally:
        m.close()
    gb = model_bytes / 1e9
    rows = [
        ("cat of the DCP shards, cold", cold["cat_shards"], None, None),
        ("cat of the mount's view, cold", cold["cat_mount"], cold["cat_shards"] / cold["cat_mount"], ">= 0.9 x cat of shards"),
        ("cat of the physical copy, cold", cold["cat_copy"], None, None),
        ("cat of the copy through the mount (FUSE floor), cold", cold["cat_fuse_plain"],
         cold["cat_copy"] / cold["cat_fuse_plain"], "the floor for any FUSE-served byte"),
        ("cat of the mount's view, warm", warm["cat_mount_warm"], warm["cat_plain_warm"] / warm["cat_mount_warm"], ">= 0.95 x cached plain file"),
        ("from_pretrained + touch, physical copy, cold", cold["load_copy"], None, None),
        ("the same through the mount (DCP), cold", cold["load_mount"], cold["load_mount"] / cold["load_copy"], "<= 1.1 x copy"),
        ("the same through the mount (HF-sharded), cold", cold["load_mount_hf"], cold["load_mount_hf"] / cold["load_copy"], "<= 1.1 x copy"),
        ("the same through the mount (DCP), --direct-reads=false, cold", cold["load_mount_block_cache"],
         cold["load_mount_block_cache"] / cold["load_copy"], "the block cache instead of direct reads"),
        ("the copy itself through the mount (FUSE floor), cold", cold["load_fuse_plain"],
         cold["load_fuse_plain"] / cold["load_copy"], "the floor for any FUSE-served load"),
        ("the same through the mount, warm", warm["load_mount_warm"], warm["load_mount_warm"] / warm["load_copy_warm"], "<= 1.05 x copy warm"),
        ("torch consolidate_safetensors_files + load", cold["consolidate_and_load"],
         cold["load_mount_hf"] / cold["consolidate_and_load"], "mount <= 0.5 x this"),
        ("torch dcp_to_torch_save + save_pretrained + load", cold["dcp_convert_and_load"],
         cold["load_mount"] / cold["dcp_convert_and_load"], "mount <= 0.5 x this"),
    ]
    return {"model_GB": round(gb, 2), "rows": [dict(what=w, seconds=round(s, 2), ratio=None if r is None else round(r, 2),
                                                       target=t) for w, s, r, t in rows],
            "mount_peak_rss_MiB": round(max(extra["mount_rss_MiB"])),
            "block_cache_mount_peak_rss_MiB": round(max(extra["block_cache_mount_rss_MiB"])), "hf_mount_peak_rss_MiB": round(max(extra["hf_mount_rss_MiB"])), "plain_mount_peak_rss_MiB": round(max(extra["plain_mount_rss_MiB"])),
            "cache_MiB": 512, "page_cache_growth_x_model": round(statistics.median(extra["cached_growth"]), 2),
            "copy_page_cache_growth_x_model": round(statistics.median(extra["copy_cached_growth"]), 2),
            "runs": {**runs, **warm_runs}}


def bench_seq(binary, work, repeat, gib):
    """Cold sequential reads of dim-0, dim-1 and mapped views vs the shards."""
    out = {}
    for name, script, args in [("dim0", "gen_big.py", ["--dim", "0", "--gib", str(gib)]),
                               ("dim1", "gen_big.py", ["--dim", "1", "--gib", str(gib)]),
                               ("mapped", "gen_megatron_like.py", ["--gib", str(gib)])]:
        src = gen(work, name, script, *args)
        shards = files(src, "*.distcp")
        mnt = os.path.join(work, "mnt")

        med, _ = interleaved({"raw": functools.partial(cold_cat, shards),
                              "view": functools.partial(cold_cat_view, binary, src, mnt),
                              "view_block_cache": functools.partial(cold_cat_view, binary, src, mnt,
                                                                    "--direct-reads=false")}, repeat)
        out[name] = dict(shards_s=round(med["raw"], 2), view_s=round(med["view"], 2),
                         ratio=round(med["raw"] / med["view"], 2), target=">= 0.9",
                         view_block_cache_s=round(med["view_block_cache"], 2),
                         ratio_block_cache=round(med["raw"] / med["view_block_cache"], 2))
    return out


def bench_chunks(binary, work, repeat):
    """Mount and list a checkpoint of 100k chunks."""
    src = gen(work, "chunks100k", "gen_chunks.py", "--chunks", "100000")
    mnt = os.path.join(work, "mnt")
    times = []
    for _ in range(repeat):
        drop_caches()
        t = time.perf_counter()
        m = Mount(binary, os.path.dirname(src), mnt)
        try:
            os.listdir(os.path.join(mnt, "chunks100k"))
            times.append(time.perf_counter() - t)
        finally:
            m.close()
    return dict(seconds=round(statistics.median(times), 3), target="<= 0.5 s")


def bench_verify(binary, work, repeat):
    """export --verify vs export, cold, into the same disk."""
    src = gen(work, "llama", "gen_llama.py")
    out = os.path.join(work, "verify-out")

    def export(*flags):
        def go():
            shutil.rmtree(out, ignore_errors=True)
            drop_caches()
            return run([binary, "export", "--quiet", *flags, src, out])[0]
        return go

    med, _ = interleaved({"export": export(), "export_verify": export("--verify")}, repeat)
    shutil.rmtree(out, ignore_errors=True)
    return dict(export_s=round(med["export"], 2), verify_s=round(med["export_verify"], 2),
                cost=round(med["export_verify"] / med["export"], 2))


def proc_cpu_seconds(pid):
    """User + system CPU seconds a live process has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_ranges(paths, readers, bs=1 << 20):
    """Seconds for `readers` forked processes to read the concatenation of
    paths, each a disjoint contiguous range of it, with 1 MiB read(2)s."""
    spans, at = [], 0
    for p in paths:
        n = os.path.getsize(p)
        spans.append((p, at, n))
        at += n
    per = -(-at // readers)
    t = time.perf_counter()
    pids = []
    for r in range(readers):
        lo, hi = r * per, min(at, (r + 1) * per)
        pid = os.fork()
        if pid == 0:
            try:
                buf = bytearray(bs)
                for p, start, n in spans:
                    a, b = max(lo, start), min(hi, start + n)
                    if a >= b:
                        continue
                    fd = os.open(p, os.O_RDONLY)
                    off = a - start
                    while off < b - start:
                        got = os.preadv(fd, [memoryview(buf)[:min(bs, b - start - off)]], off)
                        if got <= 0:
                            break
                        off += got
                    os.close(fd)
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise RuntimeError("a reader failed")
    return time.perf_counter() - t


def go_build(work, name):
    """Build the benchmark server e2e/bench/NAME into work; return its path.
    On a host without Go (a lent GPU host), a binary put there beforehand is used."""
    out = os.path.join(work, name)
    if shutil.which("go") is None and os.access(out, os.X_OK):
        return out
    # The servers are a module of their own (e2e/bench/go.mod), out of the product's.
    subprocess.run(["go", "build", "-o", out, f"./{name}"], check=True, cwd=HERE)
    return out


def null_server_read(cmd, mnt, read_ahead_kb=None, cpu=None):
    """Seconds for a cold read of the one file ("data") a null FUSE server
    (nullfs, rawfuse) mounts at mnt, with 1 MiB read(2)s; with read_ahead_kb
    the mount's kernel read-ahead is set first, and cpu gets the server's CPU
    seconds."""
    drop_caches()
    os.makedirs(mnt, exist_ok=True)
    p = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(mnt, "data")):
            if p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{cmd[0]} did not mount")
            time.sleep(0.02)
        if read_ahead_kb is not None:
            dev = os.stat(mnt).st_dev
            with open(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb", "w") as f:
                f.write(str(read_ahead_kb))
        secs = read_ranges([os.path.join(mnt, "data")], 1)
        if cpu is not None:
            cpu.append(proc_cpu_seconds(p.pid))
        return secs
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)


def bench_transport(work, repeat, gb=1.0):
    """The FUSE transport with no source at all: a cold read of a null
    server's file, go-fuse v2.12.1 (nullfs) against the transports go-fuse
    lacks (rawfuse: one /dev/fuse fd as go-fuse reads it, cloned fds, FUSE over
    io_uring with each CPU queue's thread pinned to its CPU as libfuse does, or
    not), each at the kernel's 128 KiB read-ahead and at the 8 MiB ckptfs sets
    on a tmpfs source."""
    nullfs, rawfuse = go_build(work, "nullfs"), go_build(work, "rawfuse")
    mnt = os.path.join(work, "mnt")
    size = int(gb * 1e9) // 4096 * 4096
    knob = "/sys/module/fuse/parameters/enable_uring"
    was = open(knob).read().strip() if os.path.exists(knob) else None
    # Every server caches attributes, as the mount does: go-fuse's default
    # would add a GETATTR before every read(2) to go-fuse's case alone.
    servers = {"go-fuse": [nullfs, "-attr-timeout", "1h", "-size", str(size), mnt]}
    for name, flags in (("dev", []), ("clone", []), ("uring", []), ("uring-unpinned", ["-pin=false"])):
        if not name.startswith("uring") or was is not None:
            servers[name] = [rawfuse, "-size", str(size), "-transport", name.split("-")[0], *flags, mnt]
    cpu = {}
    cases = {}
    for ra in (128, 8192):
        for name, cmd in servers.items():
            key = f"{name}@{ra}k"
            cpu[key] = []
            cases[key] = functools.partial(null_server_read, cmd, mnt, ra, cpu[key])
    try:
        if was is not None:
            with open(knob, "w") as f:
                f.write("Y")
        med, runs = interleaved(cases, repeat)
    finally:
        if was is not None:
            with open(knob, "w") as f:
                f.write(was)
    gbs = size / 1e9
    out = {"file_GB": round(gbs, 2), "uring": was is not None}
    for key in cases:
        base = key.split("@")[1]
        out[key] = dict(GBps=round(gbs / med[key], 2), cpu_s_per_GB=round(statistics.median(cpu[key]) / gbs, 2),
                        over_go_fuse=round(med[f"go-fuse@{base}"] / med[key], 2))
    out["runs"] = runs
    return out


def bench_tmpfs(binary, work, repeat):
    """The byte path against its physical limits, with no disk in the way."""
    shm = "/dev/shm/ckptfs-bench"
    src = gen(shm, "llama", "gen_llama.py", "--layers", "2")
    mapped = gen(shm, "mapped", "gen_megatron_like.py", "--gib", "0.5")
    rope = gen(shm, "rope", "gen_llama.py", "--layers", "2", "--names", "torchtitan")
    shards = files(src, "*.distcp")
    nullfs = go_build(work, "nullfs")
    mnt = os.path.join(work, "mnt")
    cpu = []

    def view_read(ckpt, readers=1, *flags):
        def go():
            drop_caches()
            m = Mount(binary, os.path.dirname(ckpt), mnt, *flags)
            try:
                secs = read_ranges(files(os.path.join(mnt, os.path.basename(ckpt)), "*.safetensors"), readers)
                if readers == 1 and ckpt == src and not flags:
                    cpu.append(proc_cpu_seconds(m.proc.pid))
                return secs
            finally:
                m.close()
        return go

    # The view's bytes as one tmpfs file, for a null server that serves them.
    flat = os.path.join(shm, "view.bin")
    m = Mount(binary, os.path.dirname(src), mnt)
    try:
        view_files = files(os.path.join(mnt, "llama"), "*.safetensors")
        view_bytes = size_of(view_files)
        with open(flat, "wb") as out:
            for v in view_files:
                with open(v, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
    finally:
        m.close()

    # The target's null server has go-fuse's defaults: its attributes are
    # never cached, so the kernel asks GETATTR before every read(2). The
    # other two cache them as the mount does and get the view's read-ahead
    # (8 MiB on tmpfs): one serves a static buffer, one preads the bytes.
    def null_read(*flags, ra=None):
        return lambda: null_server_read([nullfs, *flags, mnt], mnt, ra)

    cached = ("-attr-timeout", "1h")
    med, runs = interleaved({"shards": lambda: read_ranges(shards, 1), "view": view_read(src),
                             "null": null_read("-size", str(view_bytes)),
                             "null_cached": null_read(*cached, "-size", str(view_bytes), ra=8192),
                             "file_null_cached": null_read(*cached, "-file", flat, ra=8192),
                             "view_8_readers": view_read(src, 8),
                             "mapped_view": view_read(mapped), "mapped_unmapped": view_read(mapped, 1, "--map", "none"),
                             "rope_view": view_read(rope), "rope_unmapped": view_read(rope, 1, "--map", "none")},
                            repeat)
    gb = view_bytes / 1e9
    return dict(view_GB=round(gb, 2), shards_GBps=round(gb / med["shards"], 2), view_GBps=round(gb / med["view"], 2),
                null_GBps=round(gb / med["null"], 2), view_over_null=round(med["null"] / med["view"], 2),
                null_cached_GBps=round(gb / med["null_cached"], 2),
                view_over_null_cached=round(med["null_cached"] / med["view"], 2),
                file_null_cached_GBps=round(gb / med["file_null_cached"], 2),
                view_over_file_null_cached=round(med["file_null_cached"] / med["view"], 2),
                view_over_shards=round(med["shards"] / med["view"], 2),
                mount_cpu_s_per_GB=round(statistics.median(cpu) / gb, 2),
                readers8_over_1=round(med["view"] / med["view_8_readers"], 2),
                mapped_over_unmapped=round(med["mapped_unmapped"] / med["mapped_view"], 2),
                rope_over_unmapped=round(med["rope_unmapped"] / med["rope_view"], 2),
                targets="view >= 2.0 GB/s and >= 1.5 x null; 8 readers >= 1.6 x one where cores allow; "
                        "mapped (Megatron fused QKV; torchtitan RoPE permutation) >= 0.9 x unmapped",
                runs=runs)


# The large section's loads: from_pretrained onto the GPU where there is one
# (what a user of a GPU node runs), or torch's own dcp.load into a model
# built from the config (what one runs without ckptfs); the logits of a
# fixed input go to OUT for the bitwise comparison. Imports are not timed.
LOAD_LARGE = """
import sys, time, torch
from transformers import AutoConfig, AutoModelForCausalLM
kind, src, out = sys.argv[1:4]
dev = "cuda" if torch.cuda.is_available() else "cpu"
t = time.perf_counter()
if kind == "hf":
    m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, **({"device_map": dev} if dev == "cuda" else {}))
else:
    import torch.distributed.checkpoint as dcp
    with torch.device(dev):
        m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.bfloat16)
    dcp.load(m.state_dict(), checkpoint_id=src, no_dist=True)
if dev == "cuda":
    torch.cuda.synchronize()
secs = time.perf_counter() - t
ids = (torch.arange(64, device=dev).unsqueeze(0) * 7919) % m.config.vocab_size
with torch.no_grad():
    torch.save(m(ids).logits.float().cpu(), out)
print(dev)
print(secs)
"""

SAME_LOGITS = """
import sys, torch
ref = torch.load(sys.argv[1])
print(all(torch.equal(torch.load(f), ref) for f in sys.argv[2:]))
"""


def bench_large(binary, work, repeat, preset, lever):
    """The large-model table of ../shared/bench-gpu, with a lever (mount flags) beside it."""
    import warnings
    warnings.filterwarnings("ignore")
    src = gen(work, preset, "gen_llama.py", "--preset", preset, "--world", "8")
    copy = os.path.join(work, f"copy-{preset}")
    if not os.path.exists(os.path.join(copy, "config.json")):
        drop_caches()
        t = time.perf_counter()
        subprocess.run([binary, "export", "--quiet", src, copy], check=True)
        export_s = time.perf_counter() - t
    else:
        export_s = None
    mnt = os.path.join(work, "mnt")
    logits = os.path.join(work, "logits")
    shutil.rmtree(logits, ignore_errors=True)
    os.makedirs(logits)
    device = []

    def mounted(flags, fn):
        """fn(view dir) on a fresh mount with flags, after dropping the page cache."""
        def go():
            drop_caches()
            m = Mount(binary, os.path.dirname(src), mnt, *flags)
            try:
                return fn(os.path.join(mnt, os.path.basename(src)))
            finally:
                m.close()
        return go

    def load(kind, name):
        def go(d):
            lines = python_lines(LOAD_LARGE, kind, d, os.path.join(logits, f"{name}-{time.time_ns()}.pt"))
            device.append(lines[-2])
            return float(lines[-1])
        return go

    def cold(fn, *args):
        def go():
            drop_caches()
            return fn(*args)
        return go

    view_files = lambda d: files(d, "*.safetensors")
    cases = {
        "load_mount": mounted([], load("hf", "mount")),
        "load_copy": cold(load("hf", "copy"), copy),
        "load_dcp": cold(load("dcp", "dcp"), src),
        "cat_view": mounted([], lambda d: read_all(view_files(d))),
        "cat_shards": cold(read_all, files(src, "*.distcp")),
        "par8_view": mounted([], lambda d: read_ranges(view_files(d), 8)),
        "par8_copy": cold(read_ranges, view_files(copy), 8),
    }
    if lever:
        cases.update({
            "load_mount_lever": mounted(lever, load("hf", "mount_lever")),
            "cat_view_lever": mounted(lever, lambda d: read_all(view_files(d))),
            "par8_view_lever": mounted(lever, lambda d: read_ranges(view_files(d), 8)),
        })
    med, runs = interleaved(cases, repeat)
    ref = sorted(glob.glob(os.path.join(logits, "dcp-*.pt")))
    equal = python_lines(SAME_LOGITS, ref[0], *sorted(glob.glob(os.path.join(logits, "*.pt"))))[-1] == "True"
    gb = size_of(view_files(copy)) / 1e9
    out = dict(preset=preset, model_GB=round(gb, 2), device=sorted(set(device)), export_s=export_s and round(export_s, 2),
               seconds={k: round(v, 2) for k, v in med.items()}, lever=" ".join(lever),
               cat_view_GBps=round(gb / med["cat_view"], 2), cat_shards_GBps=round(gb / med["cat_shards"], 2),
               logits_bitwise_equal=equal,
               targets="cold cat >= 0.9 x the shards; cold from_pretrained <= 1.1 x the copy", runs=runs)
    for suffix in ["", "_lever"] if lever else [""]:
        out["load_mount_over_copy" + suffix] = round(med["load_mount" + suffix] / med["load_copy"], 2)
        out["cat_view_over_shards" + suffix] = round(med["cat_shards"] / med["cat_view" + suffix], 2)
        out["par8_view_over_copy" + suffix] = round(med["par8_copy"] / med["par8_view" + suffix], 2)
    out["load_dcp_over_copy"] = round(med["load_dcp"] / med["load_copy"], 2)
    return out


def machine():
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, kernel {platform.release()}"


def print_table(results):
    if "load" in results:
        r = results["load"]
        print(f"\nfrom_pretrained table ({r['model_GB']} GB model, median of runs, cold = drop_caches + fresh mount):")
        for row in r["rows"]:
            ratio = "" if row["ratio"] is None else f"{row['ratio']:>6.2f}  ({row['target']})"
            print(f"  {row['what']:<55} {row['seconds']:>7.2f} s  {ratio}")
        print(f"  mount peak RSS {r['mount_peak_rss_MiB']} MiB, {r['block_cache_mount_peak_rss_MiB']} MiB with "
              f"--direct-reads=false (cache {r['cache_MiB']} MiB + 64 target); "
              f"page cache growth of a load {r['page_cache_growth_x_model']} x model (target <= 1.1; "
              f"a load of the physical copy grows it {r['copy_page_cache_growth_x_model']} x)")
    for k in ("seq", "chunks", "verify", "write", "rss", "tmpfs", "transport", "objectstore", "large", "scale"):
        if k in results:
            print(f"\n{k}: {json.dumps(results[k])}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gib", type=float, default=2)
    ap.add_argument("--work", default=".bench")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--only", help="comma-separated sections: load,seq,chunks,verify,write,rss,tmpfs,transport,objectstore,large,scale")
    ap.add_argument("--scale-ranks", default="64,256,1024", help="the scale section's DCP world sizes (up to 2048)")
    ap.add_argument("--scale-formats", default="dcp,megatron,legacy,deepspeed,hfsharded,bytes,dcpsave",
                    help="the scale section's formats")
    ap.add_argument("--preset", default="llama3-3b", choices=["llama3-3b", "llama3-8b", "tiny"],
                    help="the large section's model (tiny: to try the section out)")
    ap.add_argument("--lever", default="", help="the large section: mount flags measured beside the defaults "
                                                  "(e.g. '--read-ahead 8MiB')")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: cold runs drop the page cache (/proc/sys/vm/drop_caches): run as root")
    only = set(a.only.split(",")) if a.only else {"load", "seq", "chunks", "verify", "write", "rss", "tmpfs", "transport",
                                                      "objectstore", "scale"}
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    binary = os.path.abspath(a.bin)
    results = {"machine": machine(), "repeat": a.repeat}
    if "load" in only:
        results["load"] = bench_load(binary, work, a.repeat)
    if "seq" in only:
        results["seq"] = bench_seq(binary, work, a.repeat, a.gib)
    if "chunks" in only:
        results["chunks"] = bench_chunks(binary, work, a.repeat)
    if "verify" in only:
        results["verify"] = bench_verify(binary, work, a.repeat)
    if "write" in only:
        r = subprocess.run([PY, os.path.join(HERE, "bench_write.py"), "--bin", binary, "--work", work,
                            "--gib", str(a.gib), "--repeat", str(a.repeat)],
                           check=True, stdout=subprocess.PIPE, text=True)
        results["write"] = json.loads(r.stdout)
    if "tmpfs" in only:
        results["tmpfs"] = bench_tmpfs(binary, work, a.repeat)
    if "transport" in only:
        results["transport"] = bench_transport(work, a.repeat)
    if "objectstore" in only:
        r = subprocess.run([PY, os.path.join(HERE, "bench_objstore.py"), "--bin", binary, "--work", work,
                            "--repeat", str(a.repeat)], check=True, stdout=subprocess.PIPE, text=True)
        results["objectstore"] = json.loads(r.stdout)
    if "large" in only:
        results["large"] = bench_large(binary, work, a.repeat, a.preset, a.lever.split())
    if "scale" in only:
        r = subprocess.run([PY, os.path.join(HERE, "bench_scale.py"), "--bin", binary, "--work", work,
                            "--ranks", a.scale_ranks, "--formats", a.scale_formats], check=True, stdout=subprocess.PIPE, text=True)
        results["scale"] = json.loads(r.stdout)
    if "rss" in only:
        r = subprocess.run([PY, os.path.join(HERE, "rss_readers.py"), "--bin", binary, "--work", work, "--gib", str(a.gib)],
                           check=True, stdout=subprocess.PIPE, text=True)
        results["rss"] = json.loads(r.stdout)
    print_table(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
