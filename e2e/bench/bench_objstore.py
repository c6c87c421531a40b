"""ckptfs on each object store, against a plain download of the same objects
from the same server: a cold sequential `cat` of the view mounted from
s3:// (versitygw, its posix data in tmpfs), gs:// (fake-gcs-server, in
memory) and az:// (Azurite, in memory), and `objget get` (e2e/bench/objget:
the store's own Go SDK, whole-object GETs, 8 in flight, bytes discarded) of
the shard objects, interleaved and reduced to the median. Also the mount's
requests per GB and peak RSS. Prints JSON.

    python e2e/bench/bench_objstore.py --bin bin/ckptfs [--layers 2] [--repeat 3]

Servers, mount and client share this machine's cores: the ratio says how well
the mount keeps requests in flight against each emulator, not what the
cloud's stores would give. s5cmd is not used: the Go module proxy refuses it
(github.com/peak/s5cmd/v2: 403)."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench import Mount, drop_caches, files, gen, go_build, interleaved, log, read_all, size_of  # noqa: E402

SHM = "/dev/shm/ckptfs-bench-objstore"
KEY, SECRET = "bench", "bench-secret"


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(cmd, url):
    """Start a server; wait until url gets any HTTP answer."""
    import urllib.error
    import urllib.request
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return p
        except urllib.error.HTTPError:
            return p
        except OSError:
            if p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{cmd[0]} did not start")
            time.sleep(0.1)


def tool(rel):
    p = os.path.join(ROOT, ".tools", rel)
    if not os.path.exists(p):
        sys.exit(f"bench_objstore: {p} missing (make tools)")
    return p


def start_servers():
    """Each store's server and the environment that reaches it."""
    procs, envs = [], {}
    port = free_port()
    data = os.path.join(SHM, "versitygw")
    os.makedirs(data, exist_ok=True)
    procs.append(serve([tool("bin/versitygw"), "--access", KEY, "--secret", SECRET, "--region", "us-east-1",
                        "--port", f"127.0.0.1:{port}", "--quiet", "posix", data], f"http://127.0.0.1:{port}/"))
    envs["s3"] = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
                  "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_EC2_METADATA_DISABLED": "true"}
    port = free_port()
    procs.append(serve([tool("bin/fake-gcs-server"), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                        "-backend", "memory", "-public-host", f"127.0.0.1:{port}", "-log-level", "error"],
                       f"http://127.0.0.1:{port}/storage/v1/b"))
    envs["gs"] = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{port}"}
    port = free_port()
    procs.append(serve([tool("azurite/node_modules/.bin/azurite-blob"), "--blobHost", "127.0.0.1", "--blobPort", str(port),
                        "--inMemoryPersistence", "--skipApiVersionCheck", "--disableProductStyleUrl", "--silent"],
                       f"http://127.0.0.1:{port}/devstoreaccount1?comp=list"))
    account = "devstoreaccount1"
    key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
    envs["az"] = {"AZURE_STORAGE_CONNECTION_STRING": f"DefaultEndpointsProtocol=http;AccountName={account};"
                  f"AccountKey={key};BlobEndpoint=http://127.0.0.1:{port}/{account};"}
    return procs, envs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", default=".bench")
    ap.add_argument("--layers", default="2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--stores", default="s3,gs,az")
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    binary = os.path.abspath(a.bin)
    objget = go_build(work, "objget")
    src = gen(SHM, "llama", "gen_llama.py", "--layers", a.layers)
    shards = files(src, "*.distcp")
    shard_bytes = size_of(shards)
    src_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs)
    procs, envs = start_servers()
    stores = a.stores.split(",")
    mnt = os.path.join(work, "mnt-objstore")
    extra = {}
    try:
        for s in stores:
            log(f"uploading to {s}://bench/run/llama ...")
            subprocess.run([objget, "put", f"{s}://bench/run/llama", src], check=True, env={**os.environ, **envs[s]})

        def get(s):
            def go():
                r = subprocess.run([objget, "get", f"{s}://bench/run/llama", "8"], check=True, capture_output=True,
                                   text=True, env={**os.environ, **envs[s]})
                secs, n, _ = r.stdout.split()
                assert int(n) == src_bytes, (n, src_bytes)
                return float(secs)
            return go

        def cat(s):
            def go():
                drop_caches()
                m = Mount(binary, f"{s}://bench/run", mnt, env=envs[s])
                try:
                    view = files(os.path.join(mnt, "llama"), "*.safetensors")
                    secs = read_all(view)
                    st = m.stats()["source_io"]
                    n = size_of(view)
                    extra[s] = {"view_bytes": n, "requests_per_gb": round(st["requests"] / (n / 1e9), 1),
                                "fetched_over_view": round(st["bytes_fetched"] / n, 3), "peak_rss_mib": round(m.peak_rss_mib())}
                    return secs
                finally:
                    m.close()
            return go

        cases = {}
        for s in stores:
            cases[f"{s}_get"] = get(s)
            cases[f"{s}_cat"] = cat(s)
        med, runs = interleaved(cases, a.repeat)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(os.path.join(SHM, "versitygw"), ignore_errors=True)
    out = {"shard_bytes": shard_bytes, "median_s": med, "runs_s": runs, "mount": extra}
    for s in stores:
        out[f"{s}_cat_vs_get"] = round(med[f"{s}_get"] / med[f"{s}_cat"], 3)
        out[f"{s}_cat_gbps"] = round(extra[s]["view_bytes"] / med[f"{s}_cat"] / 1e9, 3)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
