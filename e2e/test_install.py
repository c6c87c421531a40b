"""`make install` into a temporary PREFIX (and DESTDIR): the binary lands in
PREFIX/bin and runs; a PREFIX off the PATH that fuse3's mount helper searches
is pointed out."""

import os
import pathlib
import subprocess

REPO = pathlib.Path(__file__).resolve().parent.parent


def make_install(*args):
    return subprocess.run(["make", "-C", str(REPO), "--no-print-directory", "install", *args],
                          capture_output=True, text=True, timeout=600)


def test_install_prefix(tmp_path):
    r = make_install(f"PREFIX={tmp_path}/opt")
    assert r.returncode == 0, r.stderr
    binary = tmp_path / "opt" / "bin" / "ckptfs"
    assert os.access(binary, os.X_OK)
    out = subprocess.run([str(binary), "version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("ckptfs ")
    assert f"link {tmp_path}/opt/bin/ckptfs into one" in r.stderr


def test_install_destdir_default_prefix(tmp_path):
    # /usr/local/bin is on the PATH mount.fuse3 runs `ckptfs` with: no note.
    r = make_install(f"DESTDIR={tmp_path}")
    assert r.returncode == 0, r.stderr
    assert os.access(tmp_path / "usr" / "local" / "bin" / "ckptfs", os.X_OK)
    assert "link" not in r.stderr


def test_make_demo_without_torch():
    """The README's first command: its venv holds safetensors and numpy
    only, so a fresh clone runs it in seconds once Go is there."""
    r = subprocess.run(["make", "-C", str(REPO), "--no-print-directory", "demo"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "loaded 21 tensors through the mount with safetensors; identical to the export" in r.stdout
    assert "unmounted" in r.stdout
    pkgs = subprocess.run([str(REPO / ".demo-venv" / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                          capture_output=True, text=True, check=True).stdout
    assert "torch" not in pkgs, pkgs
