"""ckptfs as the system mounts it: `mount -t fuse.ckptfs SRC MNT -o ...` and an
fstab line, both through util-linux mount(8) and fuse3's mount.fuse3, which runs
`ckptfs SRC MNT -o OPTS` and must return only once the mount answers.

mount(8) runs helpers with a sanitised environment (no PATH), and mount.fuse3
runs `ckptfs` through /bin/sh, so it is found on sh's default PATH, of which
/usr/local/sbin comes first. Each test gets a private mount namespace whose
/usr/local/sbin is a temporary directory holding a `ckptfs` link to the binary
under test: nothing is installed on the machine, and the mount is read from
outside through /proc/PID/root of the namespace."""

import os
import pathlib
import shutil
import subprocess
import time

import pytest
from safetensors.torch import load_file

from conftest import BIN, TESTDATA
from test_fixtures import same_bytes

SAMPLE = TESTDATA / "sample"  # the mount source: its ckpt/ shows as an HF directory


class Namespace:
    """A private mount namespace where mount.fuse3 finds `ckptfs`."""

    def __init__(self, tmp):
        for tool in ("unshare", "nsenter", "mount", "umount"):
            assert shutil.which(tool), f"{tool} (util-linux) is needed"
        assert os.path.exists("/sbin/mount.fuse3"), "fuse3's /sbin/mount.fuse3 is needed: make deps"
        bindir = tmp / "sbin"
        bindir.mkdir()
        (bindir / "ckptfs").symlink_to(os.path.realpath(BIN))
        # The namespace lives as long as this process: cat, until stdin closes.
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
             f"mount --bind {bindir} /usr/local/sbin && echo ready && exec cat"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.holder.stdout.readline() == "ready\n", "no private mount namespace"

    def run(self, *cmd):
        """Run cmd inside the namespace; returns the CompletedProcess."""
        return subprocess.run(["nsenter", "--target", str(self.holder.pid), "--mount", "--", *map(str, cmd)],
                              capture_output=True, text=True, timeout=60)

    def path(self, p):
        """p as seen from outside the namespace."""
        return pathlib.Path(f"/proc/{self.holder.pid}/root{p}")

    def mount_line(self, mnt):
        with open(f"/proc/{self.holder.pid}/mounts") as f:
            return next((line.split() for line in f if line.split()[1] == str(mnt)), None)

    def close(self, mnt):
        if self.mount_line(mnt):
            self.run("umount", "-l", mnt)
        self.holder.stdin.close()
        self.holder.wait(timeout=10)


@pytest.fixture
def ns(tmp_path):
    n = Namespace(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    n.mnt = mnt
    yield n
    n.close(mnt)


def serving_pids(mnt):
    """ckptfs processes (the daemon and its unmount watchdog) serving mnt."""
    exe = os.path.realpath(BIN)
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.path.realpath(f"/proc/{pid}/exe") != exe:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(mnt).encode() in f.read().split(b"\0"):
                    pids.append(int(pid))
        except OSError:
            pass  # exited meanwhile
    return pids


def check_view_and_unmount(ns):
    # No polling: mount(8) returned, so the view must be there now.
    view = ns.path(ns.mnt / "ckpt" / "model.safetensors")
    got = load_file(str(view))
    want = load_file(str(SAMPLE / "expected.safetensors"))
    assert set(got) == set(want)
    for k in want:
        assert same_bytes(got[k], want[k]), k
    del got  # release the mapping before unmounting
    assert serving_pids(ns.mnt), "a detached ckptfs serves the mount"

    r = ns.run("umount", ns.mnt)
    assert r.returncode == 0, r.stderr
    assert ns.mount_line(ns.mnt) is None
    deadline = time.time() + 10
    while serving_pids(ns.mnt) and time.time() < deadline:
        time.sleep(0.05)
    assert not serving_pids(ns.mnt), "ckptfs exits once unmounted"


def test_mount_t_fuse_ckptfs(ns):
    r = ns.run("mount", "-t", "fuse.ckptfs", SAMPLE, ns.mnt,
               "-o", "ro,cache_size=64MiB,block_size=64KiB,nofail,_netdev,x-systemd.automount")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""
    src, mnt, fstype, opts = ns.mount_line(ns.mnt)[:4]
    assert fstype == "fuse.ckptfs" and src == str(SAMPLE)  # as written, so mount -a finds it mounted
    assert "ro" in opts.split(","), opts
    check_view_and_unmount(ns)


def test_fstab_line(ns, tmp_path):
    log = tmp_path / "ckptfs.log"
    fstab = tmp_path / "fstab"
    fstab.write_text(
        "# a training root, shown read-only as HF directories\n"
        f"{SAMPLE}  {ns.mnt}  fuse.ckptfs  "
        f"ro,noauto,nofail,_netdev,x-systemd.automount,x-systemd.mount-timeout=30,"
        f"cache_size=64MiB,read-ahead=1M,log_format=json,log_file={log}  0 0\n")
    r = ns.run("mount", "--fstab", fstab, ns.mnt)
    assert r.returncode == 0, r.stderr
    check_view_and_unmount(ns)
    assert '"msg":"mounting"' in log.read_text()


def test_bad_option_fails_the_mount(ns):
    r = ns.run("mount", "-t", "fuse.ckptfs", SAMPLE, ns.mnt, "-o", "cache_size=64MiB,frobnicate")
    assert r.returncode != 0
    assert 'unknown mount option "frobnicate"' in r.stderr
    assert ns.mount_line(ns.mnt) is None


def test_failed_daemon_fails_the_mount(ns):
    r = ns.run("mount", "-t", "fuse.ckptfs", SAMPLE / "no-such-dir", ns.mnt, "-o", "ro")
    assert r.returncode != 0
    assert f"{SAMPLE / 'no-such-dir'}: no such file or directory" in r.stderr
    assert ns.mount_line(ns.mnt) is None
