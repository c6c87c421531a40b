"""The write path: save_pretrained into a `ckptfs mount --rw` turns HF
safetensors into a DCP checkpoint that torch loads at any world size, and
that reads back through the mount as the same HF model."""

import errno
import gc
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

import models
from conftest import Mount, python

HERE = os.path.dirname(os.path.abspath(__file__))
INPUT = torch.tensor([[1, 5, 9, 33, 77, 120, 3, 64]])
# Megatron-style tensor parallelism: column-parallel in, row-parallel out.
TP_PLAN = "q_proj|k_proj|v_proj|gate_proj|up_proj 0\no_proj|down_proj 1\nnorm replicate\n"


def logits(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    with torch.no_grad():
        return model(INPUT).logits


def view_tensors(d):
    """Every tensor of the safetensors files in d, copied (no mmap of the
    mount stays behind to keep it busy)."""
    got = {}
    for name in sorted(os.listdir(d)):
        if name.endswith(".safetensors"):
            got.update({k: v.clone() for k, v in load_file(str(d / name)).items()})
    gc.collect()
    return got


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def chunk_layout(ckpt):
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(ckpt)).read_metadata()
    return {k: [(tuple(c.offsets), tuple(c.sizes)) for c in v.chunks]
            for k, v in meta.state_dict_metadata.items() if hasattr(v, "chunks")}


def test_save_pretrained_then_dcp_load(tmp_path, mount):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    plan = tmp_path / "tp.plan"
    plan.write_text(TP_PLAN)
    for d in "abc":
        (tmp_path / d).mkdir()
    fsdp = mount(tmp_path / "a", "--rw", "--world-size", "4")
    tp = mount(tmp_path / "b", "--rw", "--world-size", "2", "--plan", plan, "--prefix", "model")
    assert "read-write" in fsdp.output()

    model = models.build("float32")
    ref = tmp_path / "ref"
    # Small shards: several files plus an index, as for a real model.
    model.save_pretrained(ref, max_shard_size="200KB")
    model.save_pretrained(fsdp.mnt / "imported", max_shard_size="200KB")
    model.save_pretrained(tp.mnt / "imported", max_shard_size="200KB")
    # --like: the chunk layout of an existing checkpoint
    like = mount(tmp_path / "c", "--rw", "--world-size", "2", "--like", tmp_path / "b" / "imported", "--prefix", "model")
    model.save_pretrained(like.mnt / "imported", max_shard_size="200KB")
    assert len([n for n in os.listdir(ref) if n.endswith(".safetensors")]) > 1
    want = models.reference_state(str(ref))

    for m in (fsdp, tp, like):
        view = m.mnt / "imported"
        assert sorted(os.listdir(view)) == [
            "config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json"]
        got = view_tensors(view)
        assert set(got) == set(want)
        for k in want:
            assert same(got[k], want[k]), k
        back = m.src / "imported"
        assert (back / ".metadata").is_file()
        assert any(n.endswith(".distcp") for n in os.listdir(back))
        assert os.listdir(back / ".ckptfs-spool") == []

    # The TP plan and --like give the same chunk boxes; FSDP2 shards on dim 0.
    tp_layout = chunk_layout(tmp_path / "b" / "imported")
    assert chunk_layout(tmp_path / "c" / "imported") == tp_layout
    o_proj = tp_layout["model.model.layers.0.self_attn.o_proj.weight"]
    assert [sizes for _, sizes in o_proj] == [(64, 32), (64, 32)]
    assert len(tp_layout["model.model.norm.weight"]) == 1
    q_proj = chunk_layout(tmp_path / "a" / "imported")["model.layers.0.self_attn.q_proj.weight"]
    assert [sizes for _, sizes in q_proj] == [(16, 64)] * 4

    # dcp_to_torch_save of the written directories
    for src, prefix in ((tmp_path / "a", ""), (tmp_path / "b", "model")):
        out = tmp_path / f"{src.name}.pt"
        dcp_to_torch_save(str(src / "imported"), str(out))
        sd = torch.load(str(out), weights_only=True)
        if prefix:
            sd = sd[prefix]
        assert set(sd) == set(want)
        for k in want:
            assert same(sd[k], want[k]), k

    # dcp.load into FSDP2 models on 2, 3 and 4 ranks and a 2x2 TP x FSDP mesh
    code = ("import sys, models; models.check_load([(sys.argv[1], ''), (sys.argv[2], 'model')], sys.argv[3])")
    python("-c", code, tmp_path / "a" / "imported", tmp_path / "b" / "imported", ref, cwd=HERE, timeout=600)

    # from_pretrained through the mount that wrote it, and through a new read-only mount
    expect = logits(ref)
    assert torch.equal(logits(fsdp.mnt / "imported"), expect)
    assert torch.equal(logits(tp.mnt / "imported"), expect)
    ro = mount(tmp_path / "a")
    assert "read-only" in ro.output()
    assert torch.equal(logits(ro.mnt / "imported"), expect)


WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
data = open(sys.argv[2], "rb").read()
os.write(fd, data[: len(data) // 2])
print("ready", flush=True)
time.sleep(600)
"""


def test_bad_input_and_killed_mount(tmp_path, mount):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    m = Mount(src, mnt, "--rw", "--world-size", "2")
    writer = None
    try:
        d = mnt / "new"
        d.mkdir()
        good = {"w": torch.arange(24, dtype=torch.float32).reshape(6, 4)}
        save_file(good, str(d / "a.safetensors"))
        # not safetensors: close() fails with EIO, nothing committed
        with pytest.raises(OSError) as e:
            with open(d / "b.safetensors", "wb") as f:
                f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
        assert e.value.errno == errno.EIO
        # the same tensor name again: save_file renames its open temp file into
        # place, and the rename fails (save_file never checks close)
        with pytest.raises(Exception, match="Input/output error|os error 5"):
            save_file({"w": torch.zeros(3)}, str(d / "c.safetensors"))
        assert sorted(os.listdir(d)) == ["model.safetensors", "model.safetensors.index.json"]
        meta = (src / "new" / ".metadata").read_bytes()
        assert "commit" in m.output() and "already committed" in m.output()

        # ckptfs dies while a file is being written
        ref = tmp_path / "big.safetensors"
        save_file({"x": torch.ones(1000, 100)}, str(ref))
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(d / "x.safetensors"), str(ref)],
                                  stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip() == "ready"
        assert len(os.listdir(src / "new" / ".ckptfs-spool")) == 1
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait()
    finally:
        if writer is not None:
            writer.kill()
            writer.wait()
        m.close()
    deadline = time.time() + 10
    while os.path.ismount(mnt) and time.time() < deadline:
        time.sleep(0.05)
    # the spool of the dead process is left behind...
    assert len(os.listdir(src / "new" / ".ckptfs-spool")) == 1

    # ...hidden by the next writable mount, which removes it only once it
    # writes beside it (a listing deletes nothing); what was committed stays
    m2 = mount(src, "--rw")
    assert sorted(os.listdir(m2.mnt / "new")) == ["model.safetensors", "model.safetensors.index.json"]
    assert (src / "new" / ".ckptfs-spool").exists()
    (m2.mnt / "other").mkdir()
    removed = "removed the spool of an interrupted write"
    deadline = time.time() + 10
    while ((src / "new" / ".ckptfs-spool").exists() or removed not in m2.output()) and time.time() < deadline:
        time.sleep(0.05)  # the sweep runs in the background, and logs once done
    assert not (src / "new" / ".ckptfs-spool").exists()
    assert removed in m2.output()
    assert (src / "new" / ".metadata").read_bytes() == meta
    got = view_tensors(m2.mnt / "new")
    assert set(got) == {"w"} and same(got["w"], good["w"])
    # it is an existing checkpoint now: read-only
    with pytest.raises(Exception, match="os error 30|Read-only file system"):
        save_file({"y": torch.zeros(2)}, str(m2.mnt / "new" / "y.safetensors"))
