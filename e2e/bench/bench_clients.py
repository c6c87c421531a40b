"""Real clients through the mount against the same clients on a physical copy (issue 36):
Run:ai Model Streamer's SafetensorsStreamer (vLLM's --load-format runai_streamer, its
default concurrency) and a vLLM-style safe_open iteration (vLLM's
safetensors_weights_iterator: safe_open, get_tensor of every key), each reading every
tensor of the view's safetensors files; with --clients from_pretrained too,
transformers' from_pretrained (the mmap load path). Each tensor a client hands over is
copied into a fresh one, as a loader copies it into its parameter.

    python e2e/bench/bench_clients.py --bin bin/ckptfs --work DIR [--repeat 5] [--layers 2]
        [--clients streamer,safe_open] [--lever "--read-ahead 8MiB"]... [--also-bin LABEL=PATH]...
        [--strace]

Needs a Python with torch, transformers, safetensors and runai-model-streamer (not
e2e/.venv; BENCHMARKS.md, run X-clients, says how the venv was made). Root.

DIR/src/llama is a Llama-style checkpoint saved as DCP by 4 gloo ranks (gen_llama.py,
written once and kept); DIR/copy is its HF view written by `ckptfs export`. Every
client's tensors are checked byte for byte against digests of the originals, computed
in the run from the DCP shards by torch's own reader. "Cold" = sync, drop_caches,
the libraries read back, and (mount cases) a fresh mount, before every timed run;
cases interleaved, each round starting one case later; medians. The client runs as a
subprocess and times only its read of the tensors (imports excluded).

--lever adds a mount case with those extra mount flags, --also-bin one with another
build of ckptfs; --strace runs one more cold
round of each client under `strace -f -c` (client) and reports the mount's FUSE
requests by size from its debug log."""

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench import Mount, drop_caches, interleaved, log, machine, proc_cpu_seconds  # noqa: E402

PY = sys.executable
VIEW = "llama"  # the checkpoint's directory under src/, and its view's under the mount
CLIENTS = ("streamer", "safe_open")  # and from_pretrained (--clients), the mmap load path


def digest(t):
    import torch

    return hashlib.blake2b(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()


def client(kind, d, out):
    """Read every tensor of d/*.safetensors with client kind; write the read's seconds and
    each tensor's digest (taken after the clock stops) to out."""
    import glob

    import torch  # imported before the clock, as a loader has it

    if "://" in d:  # an object store's prefix, read by the streamer's own client
        files = store_files(d)
    else:
        files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    got = {}

    def load(t):
        # What vLLM's weight loader does with each tensor: param.data.copy_(loaded). get_tensor
        # may hand back a view of the file's mapping, so the copy is what faults its pages in.
        p = torch.empty_like(t)
        p.copy_(t)
        return p

    ru0 = resource.getrusage(resource.RUSAGE_SELF)  # the read's faults and CPU (digests after)
    if kind == "streamer":
        from runai_model_streamer import SafetensorsStreamer

        t = time.perf_counter()
        with SafetensorsStreamer() as s:
            s.stream_files(files)
            for name, tensor in s.get_tensors():
                got[name] = load(tensor)
        secs = time.perf_counter() - t
    elif kind == "safe_open":
        from safetensors import safe_open

        t = time.perf_counter()
        for f in files:
            with safe_open(f, framework="pt") as h:
                for name in h.keys():
                    got[name] = load(h.get_tensor(name))
        secs = time.perf_counter() - t
    elif kind == "from_pretrained":
        from transformers import AutoModelForCausalLM

        t = time.perf_counter()
        # As saved (fp32 here), so that every weight's bytes are the checkpoint's.
        m = AutoModelForCausalLM.from_pretrained(d, dtype="auto")
        for name, p in m.state_dict().items():
            got[name] = load(p)  # touches every weight (one still mapped from the file faults in)
        secs = time.perf_counter() - t
    else:
        raise SystemExit(f"unknown client {kind}")
    ru = resource.getrusage(resource.RUSAGE_SELF)
    with open(out, "w") as f:
        json.dump({"seconds": secs, "digests": {n: digest(t) for n, t in got.items()},
                   "major_faults": ru.ru_majflt - ru0.ru_majflt, "minor_faults": ru.ru_minflt - ru0.ru_minflt,
                   "cpu_s": ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime}, f)


def store_files(url):
    """The s3://BUCKET/PREFIX/*.safetensors objects, listed with boto3 (AWS_* of the environment)."""
    import boto3
    from botocore.config import Config

    if not url.startswith("s3://"):
        raise SystemExit(f"{url}: only s3:// is read directly")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    c = boto3.client("s3", config=Config(s3={"addressing_style": "path"}))
    out = c.list_objects_v2(Bucket=bucket, Prefix=prefix.rstrip("/") + "/")
    return sorted(f"s3://{bucket}/{o['Key']}" for o in out.get("Contents", []) if o["Key"].endswith(".safetensors"))


def oracle(ckpt):
    """name -> digest of every tensor of the DCP checkpoint, read by torch's DCP reader."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    sd = {}
    _load_state_dict(sd, storage_reader=FileSystemReader(ckpt), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return {n: digest(t) for n, t in sd.items()}


def warm_libraries(py=PY, modules="torch, safetensors, transformers, runai_model_streamer"):
    # Read back after drop_caches, so that only the checkpoint is read cold.
    subprocess.run([py, "-c", f"import {modules}"], check=True)


def run_client(kind, d, want, prefix=(), py=PY, env=None):
    """Run one client over d (a directory, or for the streamer an s3:// prefix) with the Python
    py; return its seconds after checking every tensor against want."""
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        subprocess.run([*prefix, py, os.path.abspath(__file__), "client", kind, d, tmp.name], check=True,
                       env=None if env is None else {**os.environ, **env})
        with open(tmp.name) as f:
            r = json.load(f)
    got = r["digests"]
    bad = sorted(n for n in want if got.get(n) != want[n])
    extra = sorted(set(got) - set(want))
    if bad or extra:
        raise SystemExit(f"{kind} on {d}: {len(bad)} of {len(want)} tensors differ or are missing "
                         f"({bad[:3]}), {len(extra)} not in the checkpoint ({extra[:3]})")
    run_client.last = r
    return r["seconds"]


class Cases:
    """The timed cases, and what each mount case's mount said about itself."""

    def __init__(self, a, want):
        self.a, self.want = a, want
        self.src = os.path.join(a.work, "src")
        self.copy = os.path.join(a.work, "copy")
        self.mnt = os.path.join(a.work, "mnt")
        self.mounts = {}  # case -> [{bytes_served, cpu_s, rss_mib}]
        self.clients = {}  # case -> [{major_faults, minor_faults, cpu_s}] of the client's read

    def note(self, name):
        r = run_client.last
        self.clients.setdefault(name, []).append({k: r[k] for k in ("major_faults", "minor_faults", "cpu_s")})

    def copy_case(self, kind):
        def f():
            drop_caches()
            warm_libraries()
            secs = run_client(kind, self.copy, self.want)
            self.note(f"{kind} copy")
            return secs
        return f

    def mount_case(self, kind, flags, name, binary=None):
        def f():
            drop_caches()
            warm_libraries()
            m = Mount(binary or self.a.bin, self.src, self.mnt, *flags)
            try:
                secs = run_client(kind, os.path.join(self.mnt, VIEW), self.want)
                self.note(name)
                self.mounts.setdefault(name, []).append({"bytes_served": m.stats()["bytes_served"],
                                                         "cpu_s": proc_cpu_seconds(m.proc.pid),
                                                         "rss_mib": m.peak_rss_mib()})
            finally:
                m.close()
            return secs
        return f


def fuse_reads(logfile):
    """The READ requests of a --debug mount log (go-fuse's "rx N: READ nI {Fh F [OFF +SIZE) ...}"
    and "tx N: ..." lines): how many of each size (KiB), and the most ever in flight at once
    (received and not yet answered), per file handle and in all."""
    import re

    rx = re.compile(r"rx (\d+): READ n\d+ \{Fh (\d+) \[(\d+) \+(\d+)\)")
    tx = re.compile(r"tx (\d+):")
    sizes, open_, per_fh, peak, peak_fh, n = {}, {}, {}, 0, 0, 0
    with open(logfile, errors="replace") as f:
        for line in f:
            m = rx.search(line)
            if m:
                n += 1
                uid, fh, size = int(m.group(1)), int(m.group(2)), int(m.group(4))
                sizes[size // 1024] = sizes.get(size // 1024, 0) + 1
                open_[uid] = fh
                per_fh[fh] = per_fh.get(fh, 0) + 1
                peak, peak_fh = max(peak, len(open_)), max(peak_fh, per_fh[fh])
                continue
            m = tx.search(line)
            if m and int(m.group(1)) in open_:
                per_fh[open_.pop(int(m.group(1)))] -= 1
    return {"reads": n, "by_kib": dict(sorted(sizes.items())), "peak_in_flight": peak,
            "peak_in_flight_one_handle": peak_fh}


def strace_round(c, kinds):
    """One cold round of each client under strace -f -c (the client's syscalls), with the
    mount logging every FUSE request; returns per client the strace summary's busiest lines
    and the READ requests by size."""
    out = {}
    for kind in kinds:
        drop_caches()
        warm_libraries()
        log_file = os.path.join(c.a.work, f"mount-debug-{kind}.log")
        if os.path.exists(log_file):
            os.remove(log_file)
        m = Mount(c.a.bin, c.src, c.mnt, "--debug", "--log-file", log_file)
        st = os.path.join(c.a.work, f"strace-{kind}.txt")
        try:
            run_client(kind, os.path.join(c.mnt, VIEW), c.want, prefix=("strace", "-f", "-c", "-o", st))
        finally:
            m.close()
        with open(st) as f:
            lines = f.read().splitlines()
        out[kind] = {"strace": lines[:14], "fuse": fuse_reads(log_file)}
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        return client(*sys.argv[2:5])
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2, help="gen_llama.py --layers: 2 = 0.94 GB fp32")
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--lever", action="append", default=[], help="extra mount flags: one more mount case")
    ap.add_argument("--also-bin", action="append", default=[], metavar="LABEL=PATH",
                    help="another ckptfs build: one more mount case (an A/B of two builds in one run)")
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    a.bin = os.path.abspath(a.bin)
    kinds = [k for k in a.clients.split(",") if k]
    ckpt = os.path.join(a.work, "src", VIEW)
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        log(f"writing {ckpt}")
        subprocess.run([PY, os.path.join(HERE, "gen_llama.py"), ckpt, "--world", "4", "--layers", str(a.layers)],
                       check=True)
    copy = os.path.join(a.work, "copy")
    if not os.path.exists(copy):
        subprocess.run([a.bin, "export", ckpt, copy], check=True)
    want = oracle(ckpt)
    size = sum(os.path.getsize(os.path.join(copy, f)) for f in os.listdir(copy) if f.endswith(".safetensors"))
    log(f"{len(want)} tensors, {size / 1e9:.2f} GB of safetensors; {machine()}; load {os.getloadavg()}")
    c = Cases(a, want)
    cases = {}
    for kind in kinds:
        cases[f"{kind} copy"] = c.copy_case(kind)
        cases[f"{kind} mount"] = c.mount_case(kind, (), f"{kind} mount")
        for lever in a.lever:
            name = f"{kind} mount {lever}"
            cases[name] = c.mount_case(kind, tuple(lever.split()), name)
        for other in a.also_bin:
            label, path = other.split("=", 1)
            name = f"{kind} mount {label}"
            cases[name] = c.mount_case(kind, (), name, os.path.abspath(path))
    load_before = os.getloadavg()
    med, runs = interleaved(cases, a.repeat)
    res = {"machine": machine(), "load_before": load_before, "load_after": os.getloadavg(),
           "tensors": len(want), "bytes": size, "median_s": med, "runs_s": runs, "mounts": c.mounts,
           "clients": c.clients}
    for kind in kinds:
        for name in med:
            if name.startswith(f"{kind} mount"):
                res.setdefault("ratio", {})[name] = med[name] / med[f"{kind} copy"]
    if a.strace:
        res["strace"] = strace_round(c, kinds)
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    for name in med:
        extra = ""
        if name in res.get("ratio", {}):
            extra = f"  {res['ratio'][name]:.2f}x the copy"
        log(f"{name:40s} {med[name]:6.2f} s (runs {', '.join(f'{x:.2f}' for x in runs[name])}){extra}"
            f"  {len(want)}/{len(want)} tensors byte-exact")


if __name__ == "__main__":
    main()
