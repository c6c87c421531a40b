"""Every committed framework-written fixture, seen three ways (ckptfs inspect,
ckptfs export, and the mount), read back with the real safetensors library:
the three agree on file names, sizes and bytes, and the tensors are the
original full tensors (same names, dtypes, shapes and bytes)."""

import json
import os
import re
import subprocess

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import TESTDATA, case_info, ckptfs, fixture_views

# Formats whose view is the directory's own files, shown as they are.
PASSTHROUGH = {"hf-safetensors"}


def expected(case):
    """name -> tensor for what the view must show (safetensors-representable ones)."""
    return load_file(str(TESTDATA / case / "expected.safetensors"))


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def load_view(d, generated=True):
    """Load every tensor of an HF directory with safe_open, checking the index
    (a directory of one model.safetensors may have none)."""
    index_path = d / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    got = {}
    for name in sorted(os.listdir(d)):
        if not name.endswith(".safetensors"):
            continue
        with safe_open(str(d / name), framework="pt") as f:
            if generated:
                assert f.metadata() == {"format": "pt"}
            for k in f.keys():
                if index is not None:
                    assert index["weight_map"][k] == name
                got[k] = f.get_tensor(k)
    if index is not None:
        assert set(index["weight_map"]) == set(got)
        assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in got.values())
    else:
        assert os.listdir(d).count("model.safetensors") == 1
    return got


def expected_hf(case):
    """name -> tensor of the HF model a mapped view must show (given the
    case's hf_config): the HF originals, or the raw tensors renamed by the
    framework's own converter, or the raw ones when their names are HF's."""
    path = TESTDATA / case / "expected_hf.safetensors"
    if path.exists():
        return load_file(str(path))
    names = case_info(case).get("hf_key_map")
    return {names[k]: v for k, v in expected(case).items()} if names else expected(case)


def check(got, case, want=None):
    want = expected(case) if want is None else want
    raw = case_info(case).get("raw", [])
    assert set(got) == set(want) | {r["name"] for r in raw if r["name"] in got}
    for k, t in want.items():
        assert same_bytes(got[k], t), k


@pytest.mark.parametrize("mapped", [False, True], ids=["raw", "hf"])
@pytest.mark.parametrize("case,view,fmt", fixture_views())
def test_inspect_export_and_mount_agree(case, view, fmt, mapped, tmp_path, mount):
    """Raw: --map none, the framework's own tensors. HF: the default view
    with the case's config (--hf-config hf_config/ when it has one), the HF
    model's tensors."""
    src = TESTDATA / case / view
    if mapped:
        flags = ["--hf-config", TESTDATA / case / "hf_config"] if (TESTDATA / case / "hf_config").is_dir() else []
        want = expected_hf(case)
    else:
        flags, want = ["--map", "none"], expected(case)
    report = json.loads(ckptfs("inspect", "--json", *flags, src).stdout)
    assert report["format"] == fmt
    out = tmp_path / "out"
    ckptfs("export", "--quiet", *flags, src, out)
    check(load_view(out, generated=fmt not in PASSTHROUGH), case, want)

    # inspect's planned files are what export wrote
    assert {f["name"]: f["size"] for f in report["view_files"]} == \
        {n: (out / n).stat().st_size for n in os.listdir(out)}

    # the mount shows the same files with the same bytes, plus the
    # checkpoint's other files shown through; format internals hidden
    m = mount(TESTDATA / case, *flags)
    mounted = m.mnt / view
    internal = {n for n in os.listdir(src) if n == ".metadata" or n.endswith(".distcp") or n == "common.pt"
                or (fmt == "hf-sharded-safetensors" and n.startswith("shard-"))
                or (fmt == "megatron-torch_dist" and n == "metadata.json")
                or (fmt == "pipeline-stages" and re.fullmatch(r"pp\d+", n))
                or (fmt == "megatron-legacy" and re.fullmatch(r"mp_rank_\d+(_\d+)?", n))
                or (fmt == "deepspeed-zero" and re.search(r"_(model|optim)_states\.pt$", n))
                or (fmt == "meta-llama" and re.fullmatch(r"consolidated\.\d+\.pth", n))
                or (fmt == "deepspeed-universal" and (n == "zero" or re.search(r"_model_states\.pt$", n)))
                or (fmt == "torch-save" and re.fullmatch(r"pytorch_model(-\d+-of-\d+)?\.bin|pytorch_model\.bin\.index\.json", n))}
    through = {n for n in os.listdir(src) if not (src / n).is_dir()} - internal
    dirs = {n for n in os.listdir(src) if (src / n).is_dir()} - internal
    assert sorted(os.listdir(mounted)) == sorted(set(os.listdir(out)) | through | dirs)
    for name in os.listdir(out):
        assert (mounted / name).read_bytes() == (out / name).read_bytes(), name
    check(load_view(mounted, generated=fmt not in PASSTHROUGH), case, want)


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


@pytest.mark.parametrize("dtype,torch_dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_dtype_view_equals_torch_to(dtype, torch_dtype, tmp_path, mount):
    """--dtype converts an fp32 checkpoint's floating tensors on read, bit for
    bit as torch's Tensor.to does; other tensors are untouched."""
    case = "hf_writer_llama"
    want = {k: (v.to(torch_dtype) if v.is_floating_point() else v) for k, v in expected(case).items()}
    out = tmp_path / "out"
    ckptfs("export", "--quiet", "--dtype", dtype, TESTDATA / case / "ckpt", out)
    m = mount(TESTDATA / case, "--dtype", dtype)
    for got in (load_view(out), load_view(m.mnt / "ckpt")):
        assert set(got) == set(want)
        for k, t in want.items():
            assert same_bytes(got[k], t), k
