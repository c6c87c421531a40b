"""How the page cache holds files: the number of pages of each file that
sit in large folios (compound pages) and in single pages, read from
/proc/self/pagemap and /proc/kpageflags (root). The pages are read first,
through a private read-only mapping.

    python e2e/bench/folios.py FILE... [--mib 64]

BENCHMARKS.md uses it to show why a warm read of a view is slower than one
of a plain file: ext4 caches in large folios, FUSE (kernel 6.18) in single
pages."""

import argparse
import mmap
import os
import struct

import numpy as np

KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL = 15, 16
PAGE = os.sysconf("SC_PAGE_SIZE")


def folio_counts(path, limit):
    fd = os.open(path, os.O_RDONLY)
    try:
        size = min(os.fstat(fd).st_size, limit) // PAGE * PAGE
        m = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    pages = np.frombuffer(m, dtype=np.uint8)
    int(pages[::PAGE].sum())  # fault every page in
    base = pages.__array_interface__["data"][0] // PAGE
    counts = dict(single=0, large=0, absent=0)
    with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
        for i in range(size // PAGE):
            pm.seek((base + i) * 8)
            entry = struct.unpack("<Q", pm.read(8))[0]
            if not entry >> 63:
                counts["absent"] += 1
                continue
            kf.seek((entry & ((1 << 55) - 1)) * 8)
            flags = struct.unpack("<Q", kf.read(8))[0]
            compound = flags >> KPF_COMPOUND_HEAD & 1 or flags >> KPF_COMPOUND_TAIL & 1
            counts["large" if compound else "single"] += 1
    del pages
    m.close()
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--mib", type=int, default=64, help="look at the first MiB of each file")
    a = ap.parse_args()
    for f in a.files:
        c = folio_counts(f, a.mib << 20)
        print(f"{f}: {c['large']} pages in large folios, {c['single']} single pages, {c['absent']} absent")


if __name__ == "__main__":
    main()
