"""ckptfs benchmarks. Every figure is a ratio to a plain-file baseline measured
in the same run, on the same disk, interleaved with it (baseline, ckptfs,
baseline, ckptfs, ...) and reduced to the median, plus peak RSS.

    python e2e/bench/bench.py --bin bin/ckptfs [--gib 2] [--work .bench] [--json out.json]

"Cold" means: os.sync(), then posix_fadvise(DONTNEED) on every file involved
(shards, view files and copies) before each timed run; this drops the guest
page cache without root. A virtual disk may still be cached by the host, so
cold figures are best read as ratios, never as absolute disk speeds."""

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
REPEAT = 3


def drop_cache(paths):
    os.sync()
    for p in paths:
        for f in ([p] if os.path.isfile(p) else glob.glob(os.path.join(p, "**", "*"), recursive=True)):
            if os.path.isfile(f):
                fd = os.open(f, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)


def run(cmd, **kw):
    """Run cmd; return (seconds, peak RSS in MiB) of that process alone."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, **kw)
    _, status, ru = os.wait4(p.pid, 0)
    secs = time.perf_counter() - t
    if status != 0:
        raise RuntimeError(f"{cmd} failed with status {status}")
    return secs, ru.ru_maxrss / 1024


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


def shards(ckpt):
    return sorted(glob.glob(os.path.join(ckpt, "*.distcp")))


def interleaved(baseline, candidate, repeat=REPEAT):
    """Median seconds of baseline() and candidate(), run alternately."""
    b, c = [], []
    for _ in range(repeat):
        b.append(baseline())
        c.append(candidate())
    return statistics.median(b), statistics.median(c)


def gen(work, name, script_args):
    out = os.path.join(work, "src", name)
    if not os.path.exists(os.path.join(out, ".metadata")):
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        subprocess.run([sys.executable, *script_args, out], check=True, env={**os.environ, "USE_LIBUV": "0"})
    return out


class Mount:
    def __init__(self, binary, src, mnt, *flags, env=None, stderr=subprocess.DEVNULL):
        os.makedirs(mnt, exist_ok=True)
        self.mnt = mnt
        self.proc = subprocess.Popen([binary, "mount", *flags, src, mnt], stderr=stderr,
                                     env=None if env is None else {**os.environ, **env})
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
    """Cold `ckptfs export` (into tmpfs) vs cold `cat` of the shards."""
    src = shards(ckpt)
    out = os.path.join(out_root, "export")
    rss = []

    def raw():
        drop_cache(src)
        return run(["cat", *src], stdout=subprocess.DEVNULL)[0]

    def export():
        shutil.rmtree(out, ignore_errors=True)
        drop_cache(src)
        secs, peak = run([binary, "export", "--quiet", ckpt, out])
        rss.append(peak)
        return secs

    raw_s, exp_s = interleaved(raw, export)
    exported = size_of(glob.glob(os.path.join(out, "*.safetensors")))
    shutil.rmtree(out)
    return dict(raw_MBps=round(size_of(src) / raw_s / 1e6), export_MBps=round(exported / exp_s / 1e6),
                ratio=round((exported / exp_s) / (size_of(src) / raw_s), 2), export_peak_rss_MiB=round(max(rss)))


def bench_mount(binary, ckpt, work, cache_mib=256):
    """Sequential cold and warm reads through the mount, random preads, RSS."""
    src = shards(ckpt)
    name = os.path.basename(ckpt)
    mnt = os.path.join(work, "mnt")
    m = Mount(binary, os.path.dirname(ckpt), mnt, "--cache-size", f"{cache_mib}MiB")
    try:
        files = sorted(glob.glob(os.path.join(mnt, name, "*.safetensors")))
        view_bytes = size_of(files)

        def raw():
            drop_cache(src)
            return read_all(src)

        def cold():
            drop_cache(src + files)  # the view's own page cache too
            return read_all(files)

        raw_s, cold_s = interleaved(raw, cold)
        rss = m.peak_rss_mib()
        # Warm: view pages stay in the kernel page cache (FOPEN_KEEP_CACHE);
        # the baseline is an ordinary file with the same bytes, also cached.
        plain = os.path.join(work, "plain.bin")
        with open(plain, "wb") as w:
            for f in files:
                with open(f, "rb") as r:
                    shutil.copyfileobj(r, w, 1 << 20)
        read_all([plain])
        read_all(files)
        plain_s, warm_s = interleaved(lambda: read_all([plain]), lambda: read_all(files))
        os.remove(plain)
        stats = m.stats()
    finally:
        m.close()
    # Random access on a fresh mount with cold caches: the safetensors/mmap pattern.
    lat = {}
    m = Mount(binary, os.path.dirname(ckpt), mnt, "--cache-size", f"{cache_mib}MiB")
    try:
        files = sorted(glob.glob(os.path.join(mnt, name, "*.safetensors")))
        drop_cache(src)
        rng = random.Random(0)
        fds = [os.open(f, os.O_RDONLY) for f in files]
        sizes = [os.fstat(fd).st_size for fd in fds]
        for _ in range(400):
            i = rng.randrange(len(fds))
            n = rng.choice([4 << 10, 64 << 10, 256 << 10, 1 << 20])
            off = rng.randrange(0, max(1, sizes[i] - n))
            t = time.perf_counter()
            os.pread(fds[i], n, off)
            lat.setdefault(n, []).append((time.perf_counter() - t) * 1e3)
        for fd in fds:
            os.close(fd)
    finally:
        m.close()
    pct = {}
    for n, xs in sorted(lat.items()):
        xs.sort()
        pct[f"{n >> 10}KiB"] = {f"p{p}": round(xs[max(0, int(len(xs) * p / 100) - 1)], 2) for p in (50, 90, 99)}
    return dict(cold_ratio=round((view_bytes / cold_s) / (size_of(src) / raw_s), 2),
                cold_MBps=round(view_bytes / cold_s / 1e6), raw_MBps=round(size_of(src) / raw_s / 1e6),
                warm_ratio=round(plain_s / warm_s, 2), warm_MBps=round(view_bytes / warm_s / 1e6),
                plain_cached_MBps=round(view_bytes / plain_s / 1e6),
                random_pread_ms=pct, peak_rss_MiB=round(rss), cache_MiB=cache_mib,
                read_MiB=round(view_bytes / 2**20), cache_stats=stats["cache"])


def bench_read_ahead(binary, ckpt, work):
    """Cold sequential MB/s through the mount for several kernel read-ahead sizes."""
    src = shards(ckpt)
    out = {}
    for ra in ["128KiB", "1MiB", "4MiB", "16MiB"]:
        m = Mount(binary, os.path.dirname(ckpt), os.path.join(work, "mnt"), "--read-ahead", ra)
        try:
            files = sorted(glob.glob(os.path.join(m.mnt, os.path.basename(ckpt), "*.safetensors")))
            runs = []
            for _ in range(REPEAT):
                drop_cache(src + files)
                runs.append(size_of(files) / read_all(files) / 1e6)
            out[ra] = round(statistics.median(runs))
        finally:
            m.close()
    return out


# from_pretrained may leave weights mapped and unread until first use, so the
# timed step also touches every page of every parameter (one element per
# 4 KiB), as the first forward pass would.
LOAD = ("import sys, time, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "t = time.perf_counter()\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "torch.cat([p.detach().reshape(-1)[::1024].float() for p in m.parameters()]).sum()\n"
        "print(time.perf_counter() - t)\n")


def load_seconds(path):
    """from_pretrained time alone (imports excluded), in a fresh interpreter."""
    r = subprocess.run([sys.executable, "-c", LOAD, path], check=True, capture_output=True, text=True)
    return float(r.stdout.strip().splitlines()[-1])


def bench_from_pretrained(binary, work):
    """Cold from_pretrained through the mount vs export + from_pretrained(copy)."""
    ckpt = gen(work, "llama", [os.path.join(HERE, "gen_llama.py")])
    src = shards(ckpt)
    out = os.path.join(work, "llama-hf")
    mounted, converted = [], []
    for _ in range(REPEAT):
        m = Mount(binary, os.path.dirname(ckpt), os.path.join(work, "mnt"))
        try:
            drop_cache(src)
            mounted.append(load_seconds(os.path.join(m.mnt, "llama")))
        finally:
            m.close()
        shutil.rmtree(out, ignore_errors=True)
        drop_cache(src)
        export_s, _ = run([binary, "export", "--quiet", ckpt, out])
        converted.append((export_s, load_seconds(out)))
    shutil.rmtree(out)
    mount_s = statistics.median(mounted)
    export_s, copy_s = min(converted, key=lambda c: c[0] + c[1])
    return dict(model_GB=round(size_of(src) / 1e9, 2), mount_load_s=round(mount_s, 2), export_s=round(export_s, 2),
                copy_load_s=round(copy_s, 2), ratio=round(mount_s / (export_s + copy_s), 2))


def machine():
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, kernel {platform.release()}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--gib", type=float, default=2)
    ap.add_argument("--work", default=".bench")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--only", help="comma-separated sections: export,mount,readahead,from_pretrained,write")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else {"export", "mount", "readahead", "from_pretrained", "write"}
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    results = {"machine": machine()}
    for dim in (0, 1):
        ckpt = gen(work, f"dim{dim}", [os.path.join(HERE, "gen_big.py"), "--dim", str(dim), "--gib", str(a.gib)])
        if "export" in only:
            shm = tempfile.mkdtemp(dir="/dev/shm") if os.path.isdir("/dev/shm") else tempfile.mkdtemp(dir=work)
            try:
                results[f"export_dim{dim}"] = bench_export(a.bin, ckpt, shm)
            finally:
                shutil.rmtree(shm, ignore_errors=True)
        if "mount" in only:
            results[f"mount_dim{dim}"] = bench_mount(a.bin, ckpt, work)
        if dim == 0 and "readahead" in only:
            results["read_ahead_MBps"] = bench_read_ahead(a.bin, ckpt, work)
    if "from_pretrained" in only:
        results["from_pretrained"] = bench_from_pretrained(a.bin, work)
    write = os.path.join(HERE, "bench_write.py")
    if "write" in only and os.path.exists(write):
        r = subprocess.run([sys.executable, write, "--bin", a.bin, "--work", work, "--gib", str(a.gib)],
                           check=True, capture_output=True, text=True)
        results["write"] = json.loads(r.stdout)
    print(json.dumps(results, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
