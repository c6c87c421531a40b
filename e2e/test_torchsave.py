"""HF PyTorch weights (pytorch_model.bin, single or sharded, as transformers
4.x save_pretrained(safe_serialization=False) wrote them) through the mount:
transformers loads the view with no missing or unexpected keys and computes
exactly the original model's logits; the view holds what transformers' own
safetensors save_pretrained holds (a tied lm_head left out)."""

import os
import sys

import pytest
import torch
from safetensors import safe_open

from conftest import ckptfs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
from gen_torchsave import INPUT_IDS, LLAMA_CFG, save_bin_like_transformers4  # noqa: E402


def view_tensors(d):
    got = {}
    for name in os.listdir(d):
        if name.endswith(".safetensors"):
            with safe_open(str(d / name), framework="pt") as f:
                got.update({k: f.get_tensor(k) for k in f.keys()})
    return got


@pytest.mark.parametrize("tied,max_shard", [(False, "50GB"), (False, "20KB"), (True, "20KB"), (True, "50GB")])
def test_from_pretrained_through_mount(tmp_path, mount, tied, max_shard):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(7)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA_CFG, tie_word_embeddings=tied)).eval()
    ck = tmp_path / "src" / "run"
    ref = tmp_path / "ref"
    os.makedirs(ck)
    model.save_pretrained(ref)
    model.config.save_pretrained(ck)
    save_bin_like_transformers4(model, ck, max_shard)
    sharded = (ck / "pytorch_model.bin.index.json").exists()
    assert sharded == (max_shard != "50GB")

    m = mount(tmp_path / "src")
    view = m.mnt / "run"
    names = set(os.listdir(view))
    assert not any(n.endswith(".bin") or n == "pytorch_model.bin.index.json" for n in names), names
    assert {"config.json", "model.safetensors.index.json"} <= names

    want = view_tensors(ref)
    got = view_tensors(view)
    assert sorted(got) == sorted(want)
    assert ("lm_head.weight" in got) == (not tied)
    for k, v in want.items():
        assert torch.equal(got[k], v), k

    loaded, info = AutoModelForCausalLM.from_pretrained(str(view), output_loading_info=True)
    assert not any(info.values()), info
    ids = torch.tensor(INPUT_IDS)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(ids).logits, model(ids).logits)

    report = ckptfs("inspect", ck).stdout
    assert "torch-save" in report
    if tied:
        assert "lm_head.weight: the same bytes as model.embed_tokens.weight" in report
