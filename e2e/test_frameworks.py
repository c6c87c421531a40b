"""Checkpoints written by the frameworks' own save code (torch's
HuggingFaceStorageWriter, save_pretrained, NeMo AutoModel, a KempnerForge
pipeline-parallel layout) load in transformers through the mount: no
missing or unexpected keys, and the fp32 logits of the original tensors
through transformers, computed in the same run, to the bit (oracle.py)."""

import json
import os

import pytest
from safetensors.torch import load_file

from conftest import TESTDATA, case_info, ckptfs, fixture_cases
from oracle import check_logits


def hf_loadable():
    """(case, view dir) for every fixture view transformers can load: the
    case has the original logits and a config.json (its own, or hf_config/
    for --hf-config). Views of framework names (Megatron, torchtitan,
    KempnerForge) load through the built-in mappings."""
    out = []
    for case in fixture_cases():
        info = case_info(case)
        if "logits" not in info or not ("config_json" in info or "hf_config" in info):
            continue
        for v in info.get("views") or [{"dir": "ckpt"}]:
            out.append(pytest.param(case, v["dir"], id=f"{case}/{v['dir']}"))
    return out


def load(path):
    from transformers import AutoModelForCausalLM

    model, loading = AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True)
    return model.eval(), loading


@pytest.mark.parametrize("case,view", hf_loadable())
def test_from_pretrained_through_mount_is_bitwise(case, view, mount):
    flags = []
    # A framework that writes no config.json beside the weights gets one
    # from --hf-config (the README's recipe).
    if (TESTDATA / case / "hf_config").is_dir():
        flags = ["--hf-config", TESTDATA / case / "hf_config"]
    m = mount(TESTDATA / case, *flags)
    model, loading = load(m.mnt / view)
    assert not loading["missing_keys"], loading
    assert not loading["unexpected_keys"], loading
    check_logits(model, case)


def test_training_roots_show_each_checkpoint(mount):
    """NeMo's step directory: model/ is the HF view, optim/ (optimizer state
    only) shows its files and one note; KempnerForge's step_N/ is one model
    from its pipeline stages, and latest/LATEST links show the same."""
    m = mount(TESTDATA / "nemo_automodel_sharded")
    step = m.mnt / "ckpt" / "epoch_0_step_1"
    assert "model.safetensors" in os.listdir(step / "model")
    optim = sorted(os.listdir(step / "optim"))
    assert optim == [".metadata", "CKPTFS_INFO.txt", "__0_0.distcp", "__1_0.distcp"]
    note = (step / "optim" / "CKPTFS_INFO.txt").read_text()
    assert "optimizer state" in note and note.count("\n") == 1
    assert (m.mnt / "ckpt" / "LATEST" / "model" / "model.safetensors").read_bytes() == \
        (step / "model" / "model.safetensors").read_bytes()

    k = mount(TESTDATA / "kempnerforge_pp")
    names = sorted(os.listdir(k.mnt / "ckpt" / "step_1"))
    assert names == ["metadata.json", "model.safetensors", "model.safetensors.index.json", "train_state.pt"]
    index = json.loads((k.mnt / "ckpt" / "step_1" / "model.safetensors.index.json").read_text())
    # KempnerForge's names, mapped to HF names by its built-in mapping
    hf_names = case_info("kempnerforge_pp")["hf_key_map"]
    assert sorted(index["weight_map"]) == sorted(hf_names[k] for k in load_file(
        str(TESTDATA / "kempnerforge_pp" / "expected.safetensors")))


def test_inspect_names_stage_errors(tmp_path):
    """A missing pipeline stage is an error naming it, never a partial model."""
    import shutil

    root = tmp_path / "step_1"
    shutil.copytree(TESTDATA / "kempnerforge_pp" / "ckpt" / "step_1", root, symlinks=True)
    shutil.move(root / "pp0", root / "pp2")
    r = ckptfs("inspect", root, check=False)
    assert r.returncode != 0
    assert "pipeline stage pp0 is missing (found pp1, pp2)" in r.stderr
    assert r.stderr.count("\n") == 1


@pytest.mark.parametrize("case", ["megatron_gpt_llama_tp2pp2", "megatron_gpt_qwen2_tp2", "megatron_gpt_mixtral_tp2ep2",
                                  "megatron_gpt_mixtral_tp2ep2_singleton", "megatron_gpt_qwen3moe_tp2ep2",
                                  "megatron_gpt_qwen2moe_tp2ep2", "megatron_legacy_llama_tp2",
                                  "megatron_legacy_llama_tp2pp2"])
def test_megatron_without_config_loads_with_generated_config(case, mount):
    """With no config.json anywhere, a Megatron view gets one made from the
    arguments in common.pt, or in model_optim_rng.pt of a legacy (torch
    format) checkpoint (vocabulary padded, as recorded) and loads in
    transformers with the original model's logits for every real token."""
    m = mount(TESTDATA / case)
    view = m.mnt / "ckpt" / "iter_0000010"
    config = json.loads((view / "config.json").read_text())
    assert config["vocab_size"] == 128
    model, loading = load(view)
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    check_logits(model, case)
    assert "vocabulary size not recorded" in m.output()
