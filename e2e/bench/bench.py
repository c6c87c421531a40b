"""ckptfs benchmarks: every figure is a ratio to a plain-file baseline measured
in the same run on the same disk, plus peak RSS. Prints a Markdown report.

    python e2e/bench/bench.py --bin bin/ckptfs [--gib 2] [--work .bench]

Cold reads drop the page cache of the files involved with
posix_fadvise(DONTNEED) before each timed step (works without root)."""

import argparse
import glob
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def drop_cache(paths):
    for p in paths:
        for f in ([p] if os.path.isfile(p) else glob.glob(os.path.join(p, "**", "*"), recursive=True)):
            if os.path.isfile(f):
                fd = os.open(f, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)


def run(cmd, **kw):
    """Run cmd, return (seconds, peak RSS in MiB) of that process alone."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, **kw)
    _, status, ru = os.wait4(p.pid, 0)
    secs = time.perf_counter() - t
    if status != 0:
        raise RuntimeError(f"{cmd} failed with status {status}")
    return secs, ru.ru_maxrss / 1024


def read_all(paths, bs=1 << 20):
    """Sequentially read files in this process; return seconds."""
    t = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(bs):
                pass
    return time.perf_counter() - t


def size_of(paths):
    return sum(os.path.getsize(p) for p in paths)


def shards(ckpt):
    return sorted(glob.glob(os.path.join(ckpt, "*.distcp")))


def gen(work, name, script_args):
    out = os.path.join(work, "src", name)
    if not os.path.exists(os.path.join(out, ".metadata")):
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([sys.executable, *script_args, out], check=True, env={**os.environ, "USE_LIBUV": "0"})
    return out


class Mount:
    def __init__(self, binary, src, mnt, *flags):
        os.makedirs(mnt, exist_ok=True)
        self.mnt = mnt
        self.proc = subprocess.Popen([binary, "mount", *flags, src, mnt], stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(mnt, ".ckptfs")):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("mount failed")
            time.sleep(0.05)

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
        self.proc.wait(timeout=30)


def bench_export(binary, ckpt, out_root):
    """Cold `ckptfs export` vs cold `cat` of the shards."""
    src = shards(ckpt)
    drop_cache(src)
    raw_s, _ = run(["cat", *src], stdout=subprocess.DEVNULL)
    out = os.path.join(out_root, "export")
    shutil.rmtree(out, ignore_errors=True)
    drop_cache(src)
    exp_s, rss = run([binary, "export", "--quiet", ckpt, out])
    exported = size_of(glob.glob(os.path.join(out, "*.safetensors")))
    shutil.rmtree(out)
    ratio = (exported / exp_s) / (size_of(src) / raw_s)
    return dict(raw_MBps=size_of(src) / raw_s / 1e6, export_MBps=exported / exp_s / 1e6, ratio=ratio,
                export_peak_rss_MiB=rss)


def bench_mount(binary, ckpt, work, cache_mib=256):
    """Cold and warm sequential reads through the mount, random preads, RSS."""
    parent = os.path.dirname(ckpt)
    name = os.path.basename(ckpt)
    src = shards(ckpt)
    m = Mount(binary, parent, os.path.join(work, "mnt"), "--cache-size", f"{cache_mib}MiB")
    try:
        files = sorted(glob.glob(os.path.join(m.mnt, name, "*.safetensors")))
        view_bytes = size_of(files)
        drop_cache(src)
        raw_s = read_all(src)
        drop_cache(src)
        cold_s = read_all(files)
        cold_ratio = (view_bytes / cold_s) / (size_of(src) / raw_s)
        rss = m.peak_rss_mib()
        # warm: the kernel page cache keeps view pages (FOPEN_KEEP_CACHE);
        # compare with an ordinary file of the same bytes, also in page cache.
        warm_s = read_all(files)
        plain = os.path.join(work, "plain.bin")
        with open(plain, "wb") as w:
            for f in files[:1]:
                with open(f, "rb") as r:
                    shutil.copyfileobj(r, w, 1 << 20)
        read_all([plain])
        plain_s = read_all([plain])
        warm_ratio = (view_bytes / warm_s) / (size_of([plain]) / plain_s)
        os.remove(plain)
        stats = m.stats()
    finally:
        m.close()
    # random access on a fresh mount (cold cache, the safetensors pattern)
    m = Mount(binary, parent, os.path.join(work, "mnt"), "--cache-size", f"{cache_mib}MiB")
    try:
        files = sorted(glob.glob(os.path.join(m.mnt, name, "*.safetensors")))
        drop_cache(src)
        rng = random.Random(0)
        lat = []
        fds = [os.open(f, os.O_RDONLY) for f in files]
        sizes = [os.fstat(fd).st_size for fd in fds]
        for _ in range(400):
            i = rng.randrange(len(fds))
            n = rng.choice([4 << 10, 64 << 10, 256 << 10, 1 << 20])
            off = rng.randrange(0, max(1, sizes[i] - n))
            t = time.perf_counter()
            os.pread(fds[i], n, off)
            lat.append((time.perf_counter() - t) * 1e3)
        for fd in fds:
            os.close(fd)
    finally:
        m.close()
    lat.sort()
    pct = {f"p{p}": round(lat[int(len(lat) * p / 100) - 1], 3) for p in (50, 90, 99)}
    return dict(cold_ratio=cold_ratio, cold_MBps=view_bytes / cold_s / 1e6, raw_MBps=size_of(src) / raw_s / 1e6,
                warm_ratio=warm_ratio, random_pread_ms=pct, peak_rss_MiB=rss, cache_MiB=cache_mib,
                read_MiB=view_bytes / 2**20, cache_stats=stats["cache"])


def bench_read_ahead(binary, ckpt, work):
    """Cold sequential MB/s through the mount for several kernel read-ahead sizes."""
    src = shards(ckpt)
    out = {}
    for ra in ["128KiB", "1MiB", "4MiB", "16MiB"]:
        m = Mount(binary, os.path.dirname(ckpt), os.path.join(work, "mnt"), "--read-ahead", ra)
        try:
            files = sorted(glob.glob(os.path.join(m.mnt, os.path.basename(ckpt), "*.safetensors")))
            drop_cache(src)
            out[ra] = round(size_of(files) / read_all(files) / 1e6)
        finally:
            m.close()
    return out


LOAD = ("import sys, time\n"
        "from transformers import AutoModelForCausalLM\n"
        "t = time.perf_counter()\n"
        "AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "print(time.perf_counter() - t)\n")


def load_seconds(path):
    """from_pretrained time alone (imports excluded), in a fresh interpreter."""
    r = subprocess.run([sys.executable, "-c", LOAD, path], check=True, capture_output=True, text=True)
    return float(r.stdout.strip().splitlines()[-1])


def bench_from_pretrained(binary, work):
    """Cold from_pretrained through the mount vs export + from_pretrained(copy)."""
    ckpt = gen(work, "llama", [os.path.join(HERE, "gen_llama.py")])
    src = shards(ckpt)
    m = Mount(binary, os.path.dirname(ckpt), os.path.join(work, "mnt"))
    try:
        drop_cache(src)
        mount_s = load_seconds(os.path.join(m.mnt, "llama"))
    finally:
        m.close()
    out = os.path.join(work, "llama-hf")
    shutil.rmtree(out, ignore_errors=True)
    drop_cache(src)
    export_s, _ = run([binary, "export", "--quiet", ckpt, out])
    copy_s = load_seconds(out)
    shutil.rmtree(out)
    return dict(model_GB=size_of(src) / 1e9, mount_load_s=mount_s, export_s=export_s, copy_load_s=copy_s,
                ratio=mount_s / (export_s + copy_s))


def machine():
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.node()}: {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, kernel {platform.release()}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--gib", type=float, default=2)
    ap.add_argument("--work", default=".bench")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    work = os.path.abspath(a.work)
    results = {"machine": machine()}
    for dim in (0, 1):
        ckpt = gen(work, f"dim{dim}", [os.path.join(HERE, "gen_big.py"), "--dim", str(dim), "--gib", str(a.gib)])
        shm = tempfile.mkdtemp(dir="/dev/shm") if os.path.isdir("/dev/shm") else tempfile.mkdtemp(dir=work)
        try:
            results[f"export_dim{dim}"] = bench_export(a.bin, ckpt, shm)
        finally:
            shutil.rmtree(shm, ignore_errors=True)
        results[f"mount_dim{dim}"] = bench_mount(a.bin, ckpt, work)
        if dim == 0:
            results["read_ahead_MBps"] = bench_read_ahead(a.bin, ckpt, work)
    results["from_pretrained"] = bench_from_pretrained(a.bin, work)
    print(json.dumps(results, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
