"""The ckptfs command line as a user meets it: help, version, inspect,
export errors, and a mount that never stays wedged."""

import json
import os
import signal
import subprocess
import time

from conftest import BIN, TESTDATA, Mount, ckptfs, is_mounted


def test_help_everywhere():
    top = ckptfs("--help").stdout
    for cmd in ["mount", "umount", "inspect", "export", "version", "completion"]:
        assert cmd in top
        r = ckptfs(cmd, "--help")
        assert r.returncode == 0 and f"Usage:\n  ckptfs {cmd} " in r.stdout and r.stderr == ""


def test_version():
    assert ckptfs("version").stdout.startswith("ckptfs ")


def test_inspect_json_names_everything():
    r = json.loads(ckptfs("inspect", "--json", TESTDATA / "nested_optim" / "ckpt").stdout)
    assert r["format"] == "torch-dcp"
    in_view = [t for t in r["tensors"] if t.get("view_file")]
    assert in_view and all(t["name"].startswith("model.") and not t["view_name"].startswith("model.") for t in in_view)
    assert not any(t["name"].startswith("optimizer.") and t.get("view_file") for t in r["tensors"])
    assert r["objects"], "non-tensor items are listed"
    assert {f["name"] for f in r["view_files"]} >= {"model.safetensors", "model.safetensors.index.json"}


def test_inspect_table():
    out = ckptfs("inspect", TESTDATA / "tp_shard1" / "ckpt").stdout
    assert "SHARDED DIMS" in out and "[1]" in out and "View files:" in out


def test_errors_are_one_line_naming_the_cause(tmp_path):
    r = ckptfs("inspect", tmp_path, check=False)
    assert r.returncode == 1 and str(tmp_path) in r.stderr and "no checkpoint" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    out = tmp_path / "exists"
    out.mkdir()
    r = ckptfs("export", TESTDATA / "sample" / "ckpt", out, check=False)
    assert r.returncode == 1 and "already exists" in r.stderr
    r = ckptfs("export", TESTDATA / "sample" / "ckpt", check=False)
    assert r.returncode == 2


def test_export_with_select_and_split(tmp_path):
    out = tmp_path / "out"
    ckptfs("export", "--quiet", "--max-shard-size", "20KB", TESTDATA / "sample" / "ckpt", out)
    files = sorted(os.listdir(out))
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    r = ckptfs("export", "--select", "nope", TESTDATA / "sample" / "ckpt", tmp_path / "x", check=False)
    assert r.returncode == 1 and "nope" in r.stderr


def test_killed_mount_does_not_stay_wedged(tmp_path):
    m = Mount(TESTDATA / "sample", tmp_path / "mnt")
    assert is_mounted(m.mnt)
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait()
    deadline = time.time() + 10
    while is_mounted(m.mnt) and time.time() < deadline:
        time.sleep(0.05)
    assert not is_mounted(m.mnt), "the watchdog detaches the mount of a dead ckptfs"
    assert os.listdir(m.mnt) == []
    m.log.close()


def test_umount_command_stops_the_server(tmp_path):
    m = Mount(TESTDATA / "sample", tmp_path / "mnt")
    ckptfs("umount", m.mnt)
    assert m.proc.wait(timeout=20) == 0
    assert not is_mounted(m.mnt)
    m.log.close()


def test_signal_while_mounting_exits_cleanly(tmp_path):
    """SIGTERM right as the mount appears (before it is reported ready) is
    handled like any other: the mount goes away and the process exits 0;
    it never dies waiting on its own mount."""
    for i in range(5):
        mnt = tmp_path / f"mnt{i}"
        mnt.mkdir()
        p = subprocess.Popen([BIN, "mount", str(TESTDATA / "sample"), str(mnt)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 30
        while not is_mounted(mnt) and p.poll() is None and time.time() < deadline:
            time.sleep(0.001)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0, p.stderr.read()
        for _ in range(100):
            if not is_mounted(mnt):
                break
            time.sleep(0.05)
        assert not is_mounted(mnt)
