"""Write-path benchmark: `cp` of an HF model's safetensors files into a
`ckptfs mount --rw` (each close reshards the file into DCP shards and
returns when they are durable) vs `cp` of the same files to a plain
directory on the same disk, in the same run, at several world sizes. Prints
JSON on stdout.

    python e2e/bench/bench_write.py --bin bin/ckptfs [--gib 2] [--world-sizes 1,4,8]

ratio_vs_cp_fsync compares with `cp` followed by fsync of every copied file,
the durability ckptfs's close gives (the target); ratio compares with a bare
`cp`, which leaves its data dirty in the page cache. Every timed copy starts
cold (sync + drop_caches). sys_s_per_GB is the mount process's system CPU
per GB written; disk_written_x is what the disk wrote during a timed copy
(/proc/diskstats) over the bytes copied: a spool written back to disk shows
there (files larger than the kernel's dirty threshold, --file-mib)."""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Mount, drop_caches, log  # noqa: E402

import numpy as np

ROWS, COLS = 4096, 4096  # 64 MiB of float32, 32 MiB of bfloat16 per tensor


def gen(work, gib, file_mib):
    """An HF model directory of about gib GiB: float32 and bfloat16 (as uint16
    bits) tensors in files of about file_mib MiB, written with safetensors'
    numpy API."""
    from safetensors.numpy import save_file

    out = os.path.join(work, f"hf-write-{gib:g}" + ("" if file_mib == 512 else f"-{file_mib}m"))
    stamp = os.path.join(out, "done")
    if os.path.exists(stamp):
        return sorted(glob.glob(os.path.join(out, "*.safetensors")))
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    rng = np.random.default_rng(0)
    total, i, nfile, cur, cur_bytes = int(gib * 2**30), 0, 0, {}, 0
    written = 0
    while written < total:
        if i % 2 == 0:
            t = rng.random((ROWS, COLS), dtype=np.float32)
        else:
            t = rng.integers(0, 1 << 16, size=(ROWS, COLS), dtype=np.uint16).view(np.uint16)
        name = f"model.layers.{i // 7}.mlp.{['gate', 'up', 'down', 'q', 'k', 'v', 'o'][i % 7]}_proj.weight"
        cur[name] = t
        cur_bytes += t.nbytes
        written += t.nbytes
        i += 1
        if cur_bytes >= file_mib << 20 or written >= total:
            nfile += 1
            save_file(cur, os.path.join(out, f"model-{nfile:05d}.safetensors"), metadata={"format": "pt"})
            cur, cur_bytes = {}, 0
    open(stamp, "w").close()
    return sorted(glob.glob(os.path.join(out, "*.safetensors")))


def settle():
    """Start every timed run alike: no dirty pages of an earlier run, and the
    disk done with the discards of files just deleted (mount -o discard)."""
    os.sync()
    time.sleep(2)


def sectors_written(path):
    """Sectors written so far by the block device holding path (/proc/diskstats)."""
    dev = os.stat(path).st_dev
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if (int(fields[0]), int(fields[1])) == (os.major(dev), os.minor(dev)):
                return int(fields[9])
    raise RuntimeError(f"no /proc/diskstats line for the device of {path}")


def timed_cp(files, dst, fsync=False, written=None, disk=None):
    """Seconds to copy files into dst (and fsync them); the bytes written
    meanwhile by the disk holding disk (default: dst) are appended to written."""
    settle()
    drop_caches()
    disk = disk or dst
    before = sectors_written(disk)
    t = time.perf_counter()
    subprocess.run(["cp", *files, dst], check=True)
    if fsync:
        for f in files:
            fd = os.open(os.path.join(dst, os.path.basename(f)), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        dfd = os.open(dst, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
    secs = time.perf_counter() - t
    if written is not None:
        written.append((sectors_written(disk) - before) * 512)
    return secs


def cpu_seconds(pid):
    """User and system CPU seconds of a process so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def bench_world(a, work, files, nbytes, world):
    plain = os.path.join(work, "write-plain")
    src = os.path.join(work, "write-src")
    mnt = os.path.join(work, "write-mnt")
    cp_s, cp_sync_s, ck_s, rss, sys_s, commits = [], [], [], [], [], 0
    cp_sync_disk, ck_disk = [], []

    def plain_cp(fsync):
        shutil.rmtree(plain, ignore_errors=True)
        os.makedirs(plain)
        secs = timed_cp(files, plain, fsync, cp_sync_disk if fsync else None)
        shutil.rmtree(plain)
        return secs

    def ckptfs_cp():
        nonlocal commits
        shutil.rmtree(src, ignore_errors=True)
        os.makedirs(src)
        m = Mount(a.bin, src, mnt, "--rw", "--world-size", str(world), "--cache-size", f"{a.cache_mib}MiB")
        try:
            os.mkdir(os.path.join(mnt, "model"))
            before = cpu_seconds(m.proc.pid)[1]
            secs = timed_cp(files, os.path.join(mnt, "model"), written=ck_disk, disk=src)
            sys_s.append(cpu_seconds(m.proc.pid)[1] - before)
            rss.append(m.peak_rss_mib())
            st = m.stats()
            commits = st["commits"]
            if st.get("commit_errors"):
                raise RuntimeError(f"commit errors: {st}")
            view = sum(os.path.getsize(f) for f in glob.glob(os.path.join(mnt, "model", "*.safetensors")))
            if view < nbytes - 4096 * len(files):
                raise RuntimeError(f"view holds {view} bytes, wrote {nbytes}")
        finally:
            m.close()
        return secs

    # The order rotates from run to run: on a VM, whichever copy comes first
    # after a pause pays for faulting fresh memory in.
    steps = [(cp_s, lambda: plain_cp(False)), (cp_sync_s, lambda: plain_cp(True)), (ck_s, ckptfs_cp)]
    for r in range(a.repeat):
        for i in range(len(steps)):
            out, step = steps[(r + i) % len(steps)]
            out.append(step())
        log(f"  world {world} run {r}: cp {cp_s[-1]:.2f}s, cp+fsync {cp_sync_s[-1]:.2f}s, "
            f"ckptfs {ck_s[-1]:.2f}s (sys {sys_s[-1]:.2f}s), VmHWM {rss[-1]:.0f} MiB")
    shutil.rmtree(src, ignore_errors=True)
    cp, cp_sync, ck = statistics.median(cp_s), statistics.median(cp_sync_s), statistics.median(ck_s)
    return dict(
        world_size=world, commits=commits,
        cp_MBps=round(nbytes / cp / 1e6), cp_fsync_MBps=round(nbytes / cp_sync / 1e6),
        reshard_MBps=round(nbytes / ck / 1e6),
        ratio=round(cp / ck, 2), ratio_vs_cp_fsync=round(cp_sync / ck, 2), target="ratio_vs_cp_fsync >= 0.8",
        sys_s_per_GB=round(statistics.median(sys_s) / (nbytes / 1e9), 2),
        disk_written_x=dict(cp_fsync=round(statistics.median(cp_sync_disk) / nbytes, 2),
                            ckptfs=round(statistics.median(ck_disk) / nbytes, 2)),
        peak_rss_MiB=round(max(rss)), cache_MiB=a.cache_mib,
        runs_s=dict(cp=[round(x, 2) for x in cp_s], cp_fsync=[round(x, 2) for x in cp_sync_s],
                    ckptfs=[round(x, 2) for x in ck_s]),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--gib", type=float, default=2)
    ap.add_argument("--work", default=".bench")
    ap.add_argument("--world-sizes", default="1,4,8")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cache-mib", type=int, default=256)
    ap.add_argument("--file-mib", type=int, default=512, help="size of each safetensors file copied")
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    files = gen(work, a.gib, a.file_mib)
    nbytes = sum(os.path.getsize(f) for f in files)
    worlds = [int(w) for w in a.world_sizes.split(",")]
    log(f"write bench: {len(files)} files, {nbytes / 1e9:.2f} GB, world sizes {worlds}")
    print(json.dumps(dict(model_GB=round(nbytes / 1e9, 2), files=len(files),
                          worlds=[bench_world(a, work, files, nbytes, w) for w in worlds]), indent=2))


if __name__ == "__main__":
    main()
