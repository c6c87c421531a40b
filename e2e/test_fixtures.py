"""Every committed torch-written fixture, exported and mounted, read back with
the real safetensors library: same names, dtypes, shapes and bytes as the
original full tensors."""

import json
import os
import subprocess

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import TESTDATA, ckptfs, fixture_cases


def expected(case):
    """name -> tensor for what the view must show (safetensors-representable ones)."""
    return load_file(str(TESTDATA / case / "expected.safetensors"))


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def load_view(d):
    """Load every tensor of an HF directory with safe_open, checking the index."""
    index = json.loads((d / "model.safetensors.index.json").read_text())
    got = {}
    for name in sorted(os.listdir(d)):
        if not name.endswith(".safetensors"):
            continue
        with safe_open(str(d / name), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            for k in f.keys():
                assert index["weight_map"][k] == name
                got[k] = f.get_tensor(k)
    assert set(index["weight_map"]) == set(got)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in got.values())
    return got


def check(got, case):
    want = expected(case)
    raw = json.loads((TESTDATA / case / "case.json").read_text()).get("raw", [])
    assert set(got) == set(want) | {r["name"] for r in raw if r["name"] in got}
    for k, t in want.items():
        assert same_bytes(got[k], t), k


@pytest.mark.parametrize("case", fixture_cases())
def test_export_loads_with_safetensors(case, tmp_path):
    out = tmp_path / "out"
    ckptfs("export", "--quiet", TESTDATA / case / "ckpt", out)
    check(load_view(out), case)


@pytest.mark.parametrize("case", fixture_cases())
def test_mount_equals_export(case, tmp_path, mount):
    out = tmp_path / "out"
    ckptfs("export", "--quiet", TESTDATA / case / "ckpt", out)
    m = mount(TESTDATA / case)
    view = m.mnt / "ckpt"
    if (TESTDATA / case / "ckpt" / "sharded").is_dir():
        # torch's enable_consolidation: ckpt/ holds torch's own consolidated
        # files (shown through as they are), ckpt/sharded/ is the checkpoint
        view = view / "sharded"
    # the view files, plus the checkpoint's other files shown through
    # (Megatron's common.pt and metadata.json); DCP internals hidden
    src = TESTDATA / case / "ckpt" if view.name == "ckpt" else TESTDATA / case / "ckpt" / "sharded"
    through = {n for n in os.listdir(src) if n != ".metadata" and not n.endswith((".distcp", ".safetensors"))}
    assert sorted(os.listdir(view)) == sorted(set(os.listdir(out)) | through)
    for name in os.listdir(out):
        assert (view / name).read_bytes() == (out / name).read_bytes(), name
    check(load_view(view), case)


def test_cli_tools_on_mount(mount):
    m = mount(TESTDATA / "sample")
    view = m.mnt / "ckpt"
    ls = subprocess.run(["ls", "-l", str(view)], capture_output=True, text=True, check=True).stdout
    assert "model.safetensors" in ls and "config.json" in ls and ".distcp" not in ls
    index = json.loads(subprocess.run(["cat", str(view / "model.safetensors.index.json")],
                                      capture_output=True, text=True, check=True).stdout)
    assert index["weight_map"]
    head = subprocess.run(["head", "-c", "8", str(view / "model.safetensors")], capture_output=True, check=True).stdout
    header_len = int.from_bytes(head, "little")
    assert (8 + header_len) % 8 == 0
    od = subprocess.run(["od", "-A", "d", "-t", "u8", "-N", "8", str(view / "model.safetensors")],
                        capture_output=True, text=True, check=True).stdout
    assert str(header_len) in od
    stats = json.loads((m.mnt / ".ckptfs").read_text())
    assert stats["bytes_served"] >= 8 and stats["views"]
