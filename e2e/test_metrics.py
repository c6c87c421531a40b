"""The Prometheus endpoint of a mount (--metrics-addr), scraped while a client
reads: its counters move by exactly the bytes read and agree with .ckptfs."""

import json
import mmap
import os
import re
import socket
import time
import urllib.request

from safetensors.torch import load, load_file

from conftest import TESTDATA
from test_fixtures import same_bytes

BLOCK = 64 << 10
SAMPLE_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(addr):
    """name{labels} -> value, for every sample of the endpoint."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    return {m[1]: float(m[2]) for m in map(SAMPLE_LINE.match, text.splitlines()) if m}


def pread_direct(fd, off, n):
    """Read n bytes at off with O_DIRECT: the kernel page cache cannot absorb
    or widen the read, so the mount serves exactly these bytes."""
    buf = mmap.mmap(-1, n)  # page-aligned, as O_DIRECT wants
    got = os.preadv(fd, [buf], off)
    return buf[:got]


def test_counters_move_by_the_bytes_read(mount):
    addr = f"127.0.0.1:{free_port()}"
    # One block per read and no read-ahead, so fills and hits are exact too;
    # reads through the block cache (a local source is read past it by
    # default).
    m = mount(TESTDATA / "sample", "--metrics-addr", addr, "--block-size", f"{BLOCK}", "--prefetch", "0",
              "--direct-reads=false")
    view = m.mnt / "ckpt" / "model.safetensors"
    size = view.stat().st_size
    assert size > 2 * BLOCK

    before = scrape(addr)
    assert before["ckptfs_bytes_served_total"] == 0
    assert before["ckptfs_open_handles"] == 0
    fd = os.open(view, os.O_RDONLY | os.O_DIRECT)
    try:
        assert scrape(addr)["ckptfs_open_handles"] == 1
        prev, read = before, b""
        for off in range(0, size, BLOCK):
            chunk = pread_direct(fd, off, BLOCK)
            read += chunk
            now = scrape(addr)
            assert now["ckptfs_bytes_served_total"] - prev["ckptfs_bytes_served_total"] == len(chunk)
            assert now["ckptfs_cache_misses_total"] - prev["ckptfs_cache_misses_total"] == 1
            assert now["ckptfs_cache_fills_total"] - prev["ckptfs_cache_fills_total"] == 1
            assert now["ckptfs_cache_fill_duration_seconds_count"] == now["ckptfs_cache_fills_total"]
            prev = now
        got, want = load(read), load_file(str(TESTDATA / "sample" / "expected.safetensors"))
        assert got.keys() == want.keys() and all(same_bytes(got[k], want[k]) for k in want)
        assert prev["ckptfs_bytes_served_total"] == size

        # Read again: served from the cache, nothing filled.
        again = pread_direct(fd, 0, BLOCK)
        now = scrape(addr)
        assert now["ckptfs_bytes_served_total"] - prev["ckptfs_bytes_served_total"] == len(again)
        assert now["ckptfs_cache_hits_total"] - prev["ckptfs_cache_hits_total"] == 1
        assert now["ckptfs_cache_fills_total"] == prev["ckptfs_cache_fills_total"]
    finally:
        os.close(fd)

    # close(2) returns before the kernel sends FUSE RELEASE (it is
    # asynchronous): wait, with a bound, for the handle to be released.
    deadline = time.time() + 10
    while scrape(addr)["ckptfs_open_handles"] != 0:
        assert time.time() < deadline, "the view's handle was never released"
        time.sleep(0.01)
    # The endpoint and the .ckptfs file are one snapshot: they agree.
    stats = json.loads((m.mnt / ".ckptfs").read_text())
    now = scrape(addr)
    assert now["ckptfs_bytes_served_total"] == stats["bytes_served"] == size + BLOCK
    assert now["ckptfs_cache_hits_total"] == stats["cache"]["hits"]
    assert now["ckptfs_cache_misses_total"] == stats["cache"]["misses"]
    assert now["ckptfs_cache_evictions_total"] == stats["cache"]["keys_evicted"]
    assert now["ckptfs_open_handles"] == stats["cache"]["open_handles"] == 0
    for kind in ("read", "fill", "commit"):
        assert now[f'ckptfs_errors_total{{kind="{kind}"}}'] == 0
    assert now['ckptfs_views{state="ok"}'] == 1
    assert now["process_resident_memory_bytes"] > 0
