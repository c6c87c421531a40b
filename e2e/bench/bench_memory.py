"""The memory and CPU figures of bench_scale.py's case without torch's own
load (minutes on a shared VM): `ckptfs inspect` of SRC (wall, user and sys
CPU, peak RSS), then one mount of BASE3, a directory of three copies of SRC
(c0, c1, c2: bench_scale.py's copies()), each view listed in turn with the
first byte of its index read: the mount's CPU seconds and RSS after each,
the bytes each view counts (`.ckptfs` metadata_bytes), RSS with the three
open, peak RSS. Prints one JSON line.

    python e2e/bench/bench_memory.py BIN SRC BASE3 MNT
"""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Mount, drop_caches  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


def cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        p = f.read().rsplit(")", 1)[1].split()
    return (int(p[11]) + int(p[12])) / CLK  # utime + stime


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for l in f:
            if l.startswith("VmRSS:"):
                return int(l.split()[1]) / 1024


def main(binary, src, base, mnt):
    out = {}
    r = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M", binary, "inspect", "--json", src],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
    e, u, sy, m = r.stderr.strip().splitlines()[-1].split()
    out["inspect"] = dict(wall=float(e), user=float(u), sys=float(sy), peak_MiB=round(int(m) / 1024))
    drop_caches()
    mo = Mount(binary, base, mnt)
    try:
        ls = []
        for i in range(3):
            c0, t0 = cpu(mo.proc.pid), time.perf_counter()
            os.listdir(os.path.join(mnt, f"c{i}"))
            t1 = time.perf_counter()
            with open(os.path.join(mnt, f"c{i}", "model.safetensors.index.json"), "rb") as fh:
                fh.read(1)
            ls.append(dict(wall=round(t1 - t0, 2), cpu=round(cpu(mo.proc.pid) - c0, 2), rss_MiB=round(rss(mo.proc.pid))))
        st = mo.stats()
        out["first_ls"] = ls
        out["counted_MiB"] = [round(v.get("metadata_bytes", 0) / 2**20, 1) for v in st["views"]]
        out["metadata_budget_MiB"] = round(st["metadata_budget"] / 2**20)
        out["rss_3_views_MiB"] = round(rss(mo.proc.pid))
        out["peak_MiB"] = round(mo.peak_rss_mib())
    finally:
        mo.close()
    return out


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))
