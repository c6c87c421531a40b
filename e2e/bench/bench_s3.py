"""ckptfs on an object store: a cold sequential read of a view mounted from
s3:// as a ratio to a plain concurrent download (boto3, s3transfer) of the
same shard objects, from a local S3-compatible server (moto) in the same run,
interleaved (download, mount, download, mount, ...) and reduced to the median.
Also reports requests per GB read and the mount's peak RSS. Not part of
`make test`.

    python e2e/bench/bench_s3.py --bin bin/ckptfs [--gib 0.5] [--work .bench] [--json out.json]

Both sides are bound by the same Python server on the same cores, so the
ratio says how well ckptfs keeps requests in flight, not what S3 would give."""

import argparse
import concurrent.futures
import glob
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench import REPEAT, Mount, gen, machine  # noqa: E402
from s3 import Moto  # noqa: E402

BUCKET, PREFIX = "bench", "run"


class Sink:
    """A write-only file that keeps nothing: what a download costs without a disk."""

    def __init__(self):
        self.n = 0

    def write(self, b):
        self.n += len(b)
        return len(b)


def download(client, keys, workers):
    """Download every key concurrently (s3transfer: ranged GETs of 8 MiB, up
    to `workers` in flight per object); return (seconds, bytes, requests)."""
    from boto3.s3.transfer import TransferConfig

    cfg = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=workers)
    sinks = [Sink() for _ in keys]
    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(keys)) as pool:
        list(pool.map(lambda ks: client.download_fileobj(BUCKET, ks[0], ks[1], Config=cfg), zip(keys, sinks)))
    secs = time.perf_counter() - t
    sizes = [client.head_object(Bucket=BUCKET, Key=k)["ContentLength"] for k in keys]
    return secs, sum(s.n for s in sinks), sum(max(1, -(-n // (8 << 20))) for n in sizes)


def read_view(binary, work, flags):
    """Mount s3://bench/run afresh (nothing cached) and read every view file
    of the checkpoint sequentially with 1 MiB reads; return (seconds, bytes,
    stats, peak RSS MiB). Opening the checkpoint is part of the time."""
    mnt = os.path.join(work, "mnt-s3")
    m = Mount(binary, f"s3://{BUCKET}/{PREFIX}", mnt, *flags)
    try:
        buf = bytearray(1 << 20)
        n = 0
        t = time.perf_counter()
        for p in sorted(glob.glob(os.path.join(mnt, "ckpt", "*.safetensors"))):
            fd = os.open(p, os.O_RDONLY)
            try:
                while k := os.readv(fd, [buf]):
                    n += k
            finally:
                os.close(fd)
        secs = time.perf_counter() - t
        return secs, n, m.stats(), m.peak_rss_mib()
    finally:
        m.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--gib", type=float, default=0.5)
    ap.add_argument("--work", default=".bench")
    ap.add_argument("--workers", type=int, default=8, help="boto3 requests in flight per object")
    ap.add_argument("--json")
    ap.add_argument("flags", nargs="*", help="extra ckptfs mount flags")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    ckpt = gen(a.work, f"s3-dim0-{a.gib}", "gen_big.py", "--dim", "0", "--gib", a.gib)
    moto = Moto()
    os.environ.update(moto.env)
    try:
        client = moto.client()
        client.create_bucket(Bucket=BUCKET)
        keys = []
        for f in sorted(os.listdir(ckpt)):
            client.upload_file(os.path.join(ckpt, f), BUCKET, f"{PREFIX}/ckpt/{f}")
            if f.endswith(".distcp"):
                keys.append(f"{PREFIX}/ckpt/{f}")
        dl, rd = [], []
        for _ in range(REPEAT):
            dl.append(download(client, keys, a.workers))
            rd.append(read_view(a.bin, a.work, a.flags))
        dl_s = statistics.median(d[0] for d in dl)
        rd_s = statistics.median(r[0] for r in rd)
        dl_bytes, rd_bytes = dl[0][1], rd[0][1]
        io = rd[-1][2]["source_io"]
        out = dict(
            machine=machine(), gib=a.gib, shards=len(keys), flags=a.flags,
            download_MBps=round(dl_bytes / dl_s / 1e6), mount_MBps=round(rd_bytes / rd_s / 1e6),
            ratio=round((rd_bytes / rd_s) / (dl_bytes / dl_s), 2),
            mount_requests_per_GB=round(io["requests"] / (rd_bytes / 1e9)),
            download_requests_per_GB=round(dl[0][2] / (dl_bytes / 1e9)),
            mount_bytes_fetched_per_byte_read=round(io["bytes_fetched"] / rd_bytes, 3),
            mount_retries=io["retries"], mount_errors=io["errors"],
            mount_peak_rss_MiB=round(max(r[3] for r in rd)),
            runs_download_s=[round(d[0], 2) for d in dl], runs_mount_s=[round(r[0], 2) for r in rd],
        )
    finally:
        moto.close()
    print(json.dumps(out, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
