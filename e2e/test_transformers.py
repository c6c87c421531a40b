"""transformers loads tiny Llama models straight from a mounted training
checkpoint and computes exactly the logits of the original model."""

import os

import pytest
import torch

from conftest import python

HERE = os.path.dirname(os.path.abspath(__file__))
INPUT = torch.tensor([[1, 5, 9, 33, 77, 120, 3, 64]])


def save(ckpt, ref, **kw):
    """Write a checkpoint in a fresh interpreter (mp.spawn workers import this module)."""
    args = [os.path.join(HERE, "models.py"), ckpt, ref]
    for k, v in kw.items():
        if v is True:
            args.append(f"--{k}")
        else:
            args += [f"--{k}", v]
    python(*args)


def logits(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    with torch.no_grad():
        return model(INPUT).logits


@pytest.mark.parametrize("mode,world,dtype", [
    ("fsdp2", 3, "float32"),
    ("fsdp2", 4, "bfloat16"),
    ("tp_fsdp", 4, "float32"),
])
def test_from_pretrained_through_mount(tmp_path, mount, mode, world, dtype):
    save(tmp_path / "run" / "ckpt", tmp_path / "reference", mode=mode, world=world, dtype=dtype)
    m = mount(tmp_path / "run")
    want = logits(tmp_path / "reference")
    got = logits(m.mnt / "ckpt")
    # Same weights, same kernels, same input: identical to the bit, in bf16 too.
    assert got.dtype == want.dtype
    assert torch.equal(got, want)


def test_training_root_with_steps_and_latest(tmp_path, mount):
    root = tmp_path / "run"
    save(root / "step_100", tmp_path / "ref_100", mode="fsdp2", world=2, nested=True)
    save(root / "step_200", tmp_path / "ref_200", mode="fsdp2", world=3)
    # training roots hold other things too
    (root / "notes.txt").write_text("lr=3e-4\n")
    os.symlink("step_200", root / "latest")
    m = mount(root)
    assert sorted(os.listdir(m.mnt)) == [".ckptfs", "latest", "notes.txt", "step_100", "step_200"]
    assert (m.mnt / "notes.txt").read_text() == "lr=3e-4\n"
    for step in ["step_100", "step_200", "latest"]:
        view = m.mnt / step
        names = set(os.listdir(view))
        assert {"model.safetensors", "model.safetensors.index.json", "config.json"} <= names
        assert not any(n.endswith(".distcp") or n == ".metadata" for n in names)
    # the nested {"model": ..., "extra": ...} state shows only the model, unprefixed
    assert torch.equal(logits(m.mnt / "step_100"), logits(tmp_path / "ref_100"))
    assert torch.equal(logits(m.mnt / "latest"), logits(tmp_path / "ref_200"))
