#!/usr/bin/env python3
"""N processes read disjoint ranges of every file (the i-th reads the i-th N-th of each), in
16 MiB preads; prints the seconds it took. What 8 readers of a view, a copy or a null server
are measured with (ab_large.sh, ab_tmpfs.sh).

    python3 e2e/bench/par_read.py N FILE..."""
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

STEP = 16 << 20


def part(args):
    i, n, files = args
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        size = os.fstat(fd).st_size
        lo, hi = size * i // n, size * (i + 1) // n
        while lo < hi:
            b = os.pread(fd, min(STEP, hi - lo), lo)
            if not b:
                break
            lo += len(b)
        os.close(fd)


def main():
    n, files = int(sys.argv[1]), sys.argv[2:]
    t = time.time()
    with ProcessPoolExecutor(n) as ex:
        list(ex.map(part, [(i, n, files) for i in range(n)]))
    print(round(time.time() - t, 2))


if __name__ == "__main__":
    main()
