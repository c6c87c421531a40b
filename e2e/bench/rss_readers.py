"""Peak RSS of a mount under many concurrent random readers.

    python e2e/bench/rss_readers.py --bin bin/ckptfs [--readers 1,16,64] [--cache-mib 64]

For each reader count: a fresh mount of a DCP checkpoint (gen_big.py, written
once under --work, shared with bench.py) with --cache-size CACHE, after
sync + drop_caches, then READERS
threads each doing random preads of 128 KiB to 1 MiB over every view file for
--seconds. Reported per count: the mount's peak RSS (VmHWM), how far it is
from the promised cache + 64 MiB, MB/s read, GC cycles per second (from
GODEBUG=gctrace=1), and the go-fuse "trySplice" lines it logged."""

import argparse
import glob
import json
import os
import random
import threading
import time

from bench import Mount, drop_caches, gen, machine

PROMISE_MIB = 64  # README: peak RSS stays within the cache + 64 MiB


def readers(files, n, seconds):
    """n threads of random preads over files for seconds; return bytes read."""
    fds = [os.open(f, os.O_RDONLY) for f in files]
    sizes = [os.fstat(fd).st_size for fd in fds]
    total = [0] * n
    stop = time.monotonic() + seconds

    def run(k):
        rng = random.Random(k)
        while time.monotonic() < stop:
            i = rng.randrange(len(fds))
            size = rng.choice([128 << 10, 256 << 10, 1 << 20])
            off = rng.randrange(0, max(1, sizes[i] - size))
            total[k] += len(os.pread(fds[i], size, off))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for fd in fds:
        os.close(fd)
    return sum(total)


def measure(binary, ckpt, work, n, cache_mib, seconds):
    log = os.path.join(work, f"mount-{n}.log")
    with open(log, "w") as errf:
        drop_caches()
        m = Mount(binary, os.path.dirname(ckpt), os.path.join(work, "mnt"), "--cache-size", f"{cache_mib}MiB",
                  env={"GODEBUG": "gctrace=1"}, stderr=errf)
        try:
            files = sorted(glob.glob(os.path.join(m.mnt, os.path.basename(ckpt), "*.safetensors")))
            t = time.perf_counter()
            nbytes = readers(files, n, seconds)
            secs = time.perf_counter() - t
            rss = m.peak_rss_mib()
            stats = m.stats()["cache"]
        finally:
            m.close()
    with open(log) as f:
        lines = f.read().splitlines()
    gcs = sum(1 for l in lines if l.startswith("gc "))
    return dict(readers=n, peak_rss_MiB=round(rss), bound_MiB=cache_mib + PROMISE_MIB,
                within=rss <= cache_mib + PROMISE_MIB, MBps=round(nbytes / secs / 1e6),
                gc_per_s=round(gcs / secs, 1), trysplice_lines=sum(1 for l in lines if "trySplice" in l),
                fills=stats["fills"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", default=".bench")
    ap.add_argument("--gib", type=float, default=2)
    ap.add_argument("--readers", default="1,16,64")
    ap.add_argument("--cache-mib", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=15)
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    ckpt = gen(work, "dim0", "gen_big.py", "--dim", "0", "--gib", str(a.gib))
    rows = [measure(os.path.abspath(a.bin), ckpt, work, int(n), a.cache_mib, a.seconds) for n in a.readers.split(",")]
    print(json.dumps({"machine": machine(), "cache_MiB": a.cache_mib, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
