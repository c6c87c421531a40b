"""Checkpoints in object storage: a real S3-compatible server (moto) on
127.0.0.1, a DCP checkpoint written to it by real torch (FsspecWriter through
s3fs, 2 gloo ranks) and an HF-sharded one (the committed hf_writer_llama
fixture, written by torch's HuggingFaceStorageWriter, uploaded with boto3:
that writer only writes local paths). ckptfs mounts, inspects and exports
s3://bucket/run directly; faults are injected by stopping the server, by a
proxy that throttles and cuts connections, and by replacing an object."""

import errno
import filecmp
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import BIN, TESTDATA, python
from s3 import FaultProxy, Moto
from oracle import check_logits
from test_frameworks import load
from test_transformers import logits

HERE = os.path.dirname(os.path.abspath(__file__))
HF_CASE = "hf_writer_llama"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The server, with s3://ckpts/run holding step_100 (DCP from torch via
    s3fs), hf_step (HF-sharded), a big DCP checkpoint for the fault tests, and
    the same objects downloaded to local disk."""
    moto = Moto()
    old = dict(os.environ)
    os.environ.update(moto.env)
    try:
        tmp = tmp_path_factory.mktemp("s3")
        c = moto.client()
        c.create_bucket(Bucket="ckpts")
        python(os.path.join(HERE, "s3.py"), "save", "s3://ckpts/run/step_100", tmp / "reference", "--world", 2)
        upload(c, TESTDATA / HF_CASE / "ckpt", "run/hf_step")
        save_big(tmp / "big")
        upload(c, tmp / "big", "run/big")
        download(c, "run/", tmp / "local")
        moto.tmp = tmp
        yield moto
    finally:
        os.environ.clear()
        os.environ.update(old)
        moto.close()


def upload(c, src, prefix):
    for root, _, files in os.walk(src):
        for f in files:
            p = os.path.join(root, f)
            c.upload_file(p, "ckpts", prefix + "/" + os.path.relpath(p, src))


def download(c, prefix, dst):
    for page in c.get_paginator("list_objects_v2").paginate(Bucket="ckpts", Prefix=prefix):
        for o in page.get("Contents", []):
            path = dst / o["Key"][len(prefix):]
            path.parent.mkdir(parents=True, exist_ok=True)
            c.download_file("ckpts", o["Key"], str(path))


def save_big(path):
    """A 24 MiB DCP checkpoint, big enough to be many blocks."""
    import torch.distributed.checkpoint as dcp

    g = torch.Generator().manual_seed(7)
    state = {"a.weight": torch.randn(2048, 2048, generator=g), "b.weight": torch.randn(1024, 2048, generator=g)}
    dcp.save(state, checkpoint_id=str(path), no_dist=True)


def run(*args, check=True, env=None):
    return subprocess.run([BIN, *map(str, args)], check=check, capture_output=True, text=True, env=env)


def stats(m):
    return json.loads((m.mnt / ".ckptfs").read_text())


def test_transformers_loads_from_s3(s3, mount):
    m = mount("s3://ckpts/run", "--hf-config", TESTDATA / HF_CASE / "hf_config")
    assert sorted(os.listdir(m.mnt)) == [".ckptfs", "big", "hf_step", "step_100"]
    # DCP written by torch through s3fs: the original model's logits to the bit.
    assert torch.equal(logits(m.mnt / "step_100"), logits(s3.tmp / "reference"))
    # HF-sharded by torch's writer: no missing keys, the original logits.
    model, loading = load(m.mnt / "hf_step")
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    check_logits(model, HF_CASE)
    st = stats(m)
    assert st["source"] == "s3://ckpts/run"
    assert st["source_io"]["requests"] > 0 and st["source_io"]["errors"] == 0


def test_inspect_and_export_equal_local(s3, tmp_path):
    for name in ["step_100", "hf_step", "big"]:
        local = s3.tmp / "local" / name
        # The same report but for where the files are.
        got = run("inspect", "--json", f"s3://ckpts/run/{name}").stdout.replace(f"s3://ckpts/run/{name}", "DIR")
        want = run("inspect", "--json", local).stdout.replace(str(local), "DIR")
        assert json.loads(got) == json.loads(want), name
        run("export", "--quiet", f"s3://ckpts/run/{name}", tmp_path / f"{name}-s3")
        run("export", "--quiet", local, tmp_path / f"{name}-local")
        files = sorted(os.listdir(tmp_path / f"{name}-local"))
        assert sorted(os.listdir(tmp_path / f"{name}-s3")) == files
        match, mismatch, errors = filecmp.cmpfiles(tmp_path / f"{name}-s3", tmp_path / f"{name}-local", files, shallow=False)
        assert not mismatch and not errors, name
    # --root confines to a prefix above the checkpoint.
    assert run("inspect", "--root", "s3://ckpts/run", "s3://ckpts/run/step_100").returncode == 0
    r = run("inspect", "--root", "s3://ckpts/run/hf_step", "s3://ckpts/run/step_100", check=False)
    assert r.returncode == 1 and "is not inside --root" in r.stderr


def test_read_only(s3, tmp_path):
    r = run("mount", "--rw", "s3://ckpts/run", tmp_path, check=False)
    assert r.returncode == 2
    assert "s3://ckpts/run cannot be mounted writable" in r.stderr
    r = run("inspect", "s3://ckpts/run/nothing", check=False)
    assert r.returncode == 1 and "s3://ckpts/run/nothing" in r.stderr and len(r.stderr.splitlines()) == 1


def reference(s3, tmp_path, name="big"):
    """The view files of a checkpoint, exported from its local copy."""
    out = tmp_path / f"ref-{name}"
    if not out.exists():
        run("export", "--quiet", s3.tmp / "local" / name, out)
    return out


def test_view_read_in_few_requests(s3, tmp_path, mount):
    """A cold read of the big DCP view (one 24 MiB object of two torch.save
    records) costs one LIST (the open's, answering every lookup), the
    .metadata GET, the first record's directory (a window at its end) and
    one streamed GET from 0 that serves the record's headers and then the
    data (requests of 64 MiB with a 512 MiB cache): 4, where each header,
    directory and lookup was a request of its own; each byte fetched about
    once; byte-exact."""
    ref = reference(s3, tmp_path)
    m = mount("s3://ckpts/run/big", "--cache-size", "512MiB")
    want = (ref / "model.safetensors").read_bytes()
    with open(m.mnt / "model.safetensors", "rb", buffering=0) as f:
        got = b"".join(iter(lambda: f.read(1 << 20), b""))
    assert got == want
    io = stats(m)["source_io"]
    assert io["requests"] <= 4, io
    assert io["bytes_fetched"] <= 1.05 * len(want), io
    assert io["errors"] == 0


def test_server_stopped_mid_read(s3, tmp_path, mount):
    ref = reference(s3, tmp_path)
    # One attempt of 3 s, no backoff: a failed read takes 3 s, twice that
    # if asked again. Each block its own request (no streams): streams may
    # have fetched the whole view before the stop, and then no read after it
    # reaches the store (objstore's TestAheadChangedMidStream checks that a
    # read past a failed stream fails with it, asking no second time).
    m = mount("s3://ckpts/run", "--read-timeout", "3s", "--max-attempts", "1", "--block-size", "1MiB", "--prefetch", "0",
              "--fetch-ahead=false")
    view = m.mnt / "big" / "model.safetensors"
    want = (ref / "model.safetensors").read_bytes()
    with open(view, "rb", buffering=0) as f:
        assert f.read(4 << 20) == want[:4 << 20]
        s3.stop()
        try:
            start = time.time()
            with pytest.raises(OSError) as e:
                while f.read(1 << 20):  # past what the kernel read ahead
                    pass
            assert e.value.errno == errno.EIO
            # Within the retry budget, not twice it: the kernel reads a page
            # whose read-ahead failed again at once, and that read fails
            # without asking the store again.
            took = time.time() - start
            assert took < 4.5, f"a stopped server fails reads within the retry budget: {took:.1f} s"
        finally:
            s3.cont()
        # Nothing failed stays failed: once the reads still in flight at the
        # stop have failed too, and their failures are a second old (served
        # again for that long), the same handle reads on, exactly.
        wait_for(lambda: stats(m)["cache"]["filling_bytes"] == 0, "the fills of the stop ended")
        time.sleep(1)
        f.seek(4 << 20)
        assert f.read() == want[4 << 20:]
    assert stats(m)["source_io"]["errors"] > 0
    assert "s3://ckpts/run/big/" in m.output()


def test_interrupted_read_of_a_frozen_store_ends_at_once(s3, tmp_path, mount):
    """A reader interrupted while its read waits on a store that stopped
    answering gets control back at once: the kernel sends FUSE INTERRUPT, and
    the read answers it (EINTR) instead of waiting out the fill's retry
    budget, which goes on for whoever reads next."""
    m = mount("s3://ckpts/run", "--read-timeout", "5s", "--max-attempts", "2", "--block-size", "1MiB",
              "--prefetch", "0")
    view = m.mnt / "big" / "model.safetensors"
    # The reader opens the view while the store answers, then reads once told
    # to: the signal then finds it in read(2), however long it took to start.
    # O_DIRECT: a read the reader waits on as a FUSE request of its own. (A
    # buffered read waits for its pages, which a fatal signal ends and the
    # kernel sends no INTERRUPT for.)
    reader = subprocess.Popen([sys.executable, "-c", f"import mmap, os, sys; fd = os.open({str(view)!r}, os.O_RDONLY | os.O_DIRECT); "
                               "print('open', flush=True); sys.stdin.readline(); "
                               "os.preadv(fd, [mmap.mmap(-1, 1 << 20)], 20 << 20)"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline() == "open\n", reader.stderr.read()
        s3.stop()
        start = time.time()
        reader.stdin.write("read\n")
        reader.stdin.flush()
        time.sleep(1)  # blocked in read(2) on a block the store does not send
        assert reader.poll() is None, reader.communicate()
        # SIGINT, which Python handles: not a fatal signal, so only an answer
        # to the kernel's INTERRUPT ends the read before the fill does.
        reader.send_signal(signal.SIGINT)
        _, err = reader.communicate(timeout=60)
        took = time.time() - start
        assert "KeyboardInterrupt" in err, err
        # The fill's own budget is 2 attempts of 5 s (and the bytes at
        # --min-rate) plus a backoff: over 10 s.
        assert took < 4, f"an interrupted reader of a frozen store ended after {took:.1f} s"
    finally:
        s3.cont()
        reader.kill()
        reader.wait()
    assert "INTERRUPT" not in m.output()


def test_interrupted_open_of_a_frozen_store_ends_at_once(s3, tmp_path, mount):
    """An open of a view file stats its sources, which asks the store once
    the stats it keeps a second are old: a signal ends an open that waits on
    a store that stopped answering at once, and the view still opens once
    the store is back."""
    m = mount("s3://ckpts/run", "--read-timeout", "5s", "--max-attempts", "2")
    view = m.mnt / "big" / "model.safetensors"
    with open(view, "rb") as f:
        assert len(f.read(8)) == 8
    # The open is made relative to the view's directory, held open: no
    # lookup of the path on the way, whose entries are kept only a second.
    big = os.open(m.mnt / "big", os.O_RDONLY | os.O_DIRECTORY)
    s3.stop()
    try:
        time.sleep(1.5)  # the stats of the open above are old
        start = time.time()
        p = subprocess.Popen([sys.executable, "-c", f"import os; os.open('model.safetensors', os.O_RDONLY, dir_fd={big})"],
                             stderr=subprocess.PIPE, text=True, pass_fds=(big,))
        time.sleep(1)
        assert p.poll() is None, f"the open did not wait on the store: {p.communicate()}"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        took = time.time() - start
        assert "KeyboardInterrupt" in err, err
        assert took < 4, f"an interrupted open ended after {took:.1f} s"
    finally:
        s3.cont()
        os.close(big)
    with open(view, "rb") as f:
        assert len(f.read(8)) == 8


def test_interrupted_lookup_of_a_frozen_store_ends_at_once(s3, tmp_path, mount):
    """timeout(1) or Ctrl-C on a stat or ls that waits on a store that stopped
    answering: the kernel sends FUSE INTERRUPT and gets EINTR at once."""
    m = mount("s3://ckpts/run", "--read-timeout", "5s", "--max-attempts", "2")
    assert "big" in os.listdir(m.mnt)
    s3.stop()
    time.sleep(1.5)  # listings are kept a second
    try:
        for call in (f"os.stat({str(m.mnt / 'not-seen-before')!r})", f"os.listdir({str(m.mnt / 'hf_step')!r})"):
            start = time.time()
            p = subprocess.Popen([sys.executable, "-c", f"import os; {call}"], stderr=subprocess.PIPE, text=True)
            time.sleep(1)
            assert p.poll() is None, f"the call did not wait on the store: {p.communicate()}"
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=60)
            took = time.time() - start
            assert "KeyboardInterrupt" in err, err
            assert took < 4, f"{call} interrupted ended after {took:.1f} s"
    finally:
        s3.cont()
    assert os.listdir(m.mnt / "hf_step"), "the mount answers once the store is back"


def test_fault_proxy_retries(s3, tmp_path, mount):
    ref = reference(s3, tmp_path)
    proxy = FaultProxy(("127.0.0.1", s3.port), every=3)
    try:
        m = mount("s3://ckpts/run", "--endpoint", proxy.endpoint, "--max-attempts", "10", "--block-size", "1MiB")
        for name in os.listdir(ref):
            assert (m.mnt / "big" / name).read_bytes() == (ref / name).read_bytes(), name
        st = stats(m)["source_io"]
        assert proxy.slowdowns > 2 and proxy.cuts > 2, (proxy.slowdowns, proxy.cuts)
        assert st["retries"] >= proxy.slowdowns + proxy.cuts - 4  # a few fell before the counters' tree
        assert st["errors"] == 0
        # export through the proxy too
        out = tmp_path / "via-proxy"
        run("export", "--quiet", "--endpoint", proxy.endpoint, "--max-attempts", "10", "s3://ckpts/run/big", out)
        for name in os.listdir(ref):
            assert (out / name).read_bytes() == (ref / name).read_bytes(), name
        # The server unreachable: EIO; back: the reads are served again.
        # Each read its own request: a stream (or read-ahead) may hold the
        # bytes at 16 MiB before the server goes (objstore's TestAhead*
        # cover a stream cut by the store).
        proxy.faults = False
        m2 = mount("s3://ckpts/run", "--endpoint", proxy.endpoint, "--max-attempts", "2", "--block-size", "1MiB",
                   "--prefetch", "0", "--fetch-ahead=false")
        view = m2.mnt / "big" / "model.safetensors"
        want = (ref / "model.safetensors").read_bytes()
        with open(view, "rb", buffering=0) as f:
            assert f.read(1 << 20) == want[:1 << 20]
            proxy.down()
            f.seek(16 << 20)
            with pytest.raises(OSError) as e:
                f.read(1 << 20)
            assert e.value.errno == errno.EIO
            proxy.up()
            # A block that failed fails again for a second without a request.
            wait_for(lambda: stats(m2)["cache"]["filling_bytes"] == 0, "the fills of the outage ended")
            time.sleep(1)
            f.seek(16 << 20)
            assert f.read() == want[16 << 20:]
    finally:
        proxy.close()


def test_object_replaced_while_mounted(s3, tmp_path, mount):
    c = s3.client()
    c.copy_object(Bucket="ckpts", Key="run2/big/.metadata", CopySource={"Bucket": "ckpts", "Key": "run/big/.metadata"})
    for o in c.list_objects_v2(Bucket="ckpts", Prefix="run/big/")["Contents"]:
        c.copy_object(Bucket="ckpts", Key="run2/" + o["Key"][4:], CopySource={"Bucket": "ckpts", "Key": o["Key"]})
    ref = reference(s3, tmp_path)
    want = (ref / "model.safetensors").read_bytes()
    # Each read its own request (no streams), so that the reads after the
    # replacement ask the store again (objstore's TestAheadChangedMidStream
    # has a stream's).
    m = mount("s3://ckpts/run2", "--block-size", "1MiB", "--prefetch", "0", "--fetch-ahead=false")
    view = m.mnt / "big" / "model.safetensors"
    with open(view, "rb", buffering=0) as f:
        head = f.read(1 << 20)
        assert head == want[:1 << 20]
        shard = "run2/big/__0_0.distcp"
        size = c.head_object(Bucket="ckpts", Key=shard)["ContentLength"]
        c.put_object(Bucket="ckpts", Key=shard, Body=b"\x5a" * size)  # same size, new bytes
        got = bytearray()
        with pytest.raises(OSError) as e:
            while chunk := f.read(1 << 20):
                got += chunk
        assert e.value.errno == errno.EIO
        # What was served before the error is the original, never the new bytes.
        assert bytes(got) == want[1 << 20:(1 << 20) + len(got)]
    time.sleep(1.1)  # past the listing that answered the first open
    with pytest.raises(OSError) as e:
        view.read_bytes()
    assert e.value.errno == errno.EIO
    lines = [ln for ln in m.output().splitlines() if "s3://ckpts/run2/big/__0_0.distcp" in ln]
    assert lines and all("ETag" in ln or "replaced" in ln for ln in lines), m.output()


def test_cache_dir_survives_restart(s3, tmp_path, mount):
    ref = reference(s3, tmp_path)
    cache = tmp_path / "cache"
    flags = ["--cache-dir", cache, "--cache-dir-size", "1GiB"]
    m = mount("s3://ckpts/run", *flags)
    assert (m.mnt / "big" / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    first = stats(m)["source_io"]
    assert first["disk_misses"] > 0 and first["bytes_fetched"] > 24 << 20
    m.close()
    m = mount("s3://ckpts/run", *flags)
    assert (m.mnt / "big" / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    again = stats(m)["source_io"]
    assert again["disk_hits"] > 0 and again.get("disk_misses", 0) == 0
    assert again["bytes_fetched"] < 1 << 20, "only metadata is fetched after a restart"


def wait_for(cond, what, timeout=10):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.02)


def test_unmount_with_stalled_store_is_prompt(s3, tmp_path, mount):
    """Read-ahead requests hanging on a store that stopped answering do not
    hold the exit for their timeouts (30 s per attempt, here)."""
    # The block cache's read-ahead, each block its own request (no streams,
    # which would have fetched the blocks before the stop).
    m = mount("s3://ckpts/run", "--block-size", "1MiB", "--prefetch", "8", "--fetch-ahead=false")
    fd = os.open(m.mnt / "big" / "model.safetensors", os.O_RDONLY)
    try:
        # No kernel read-ahead: only ckptfs's own is in flight at the stop.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        # Sequential reads ramp ckptfs's read-ahead up to blocks 6..11; once
        # those are in, the store stops, and reading the cached block 6 sends
        # read-ahead for block 12 at a store that does not answer.
        for block in range(6):
            os.pread(fd, 1 << 20, block << 20)
        wait_for(lambda: stats(m)["cache"]["filling_bytes"] == 0, "read-ahead done")
        s3.stop()
        os.pread(fd, 1 << 20, 6 << 20)
        wait_for(lambda: stats(m)["cache"]["filling_bytes"] > 0, "read-ahead in flight at the stop")
    finally:
        os.close(fd)
    try:
        start = time.time()
        m.close()
        took = time.time() - start
        assert m.proc.returncode == 0, m.output()
        assert took < 5, (took, m.output())
    finally:
        s3.cont()
