"""Issue 37, round four: Composer, OLMo-core, Lightning FSDP and Trainer FSDP
checkpoints, each written by the framework's own save code (e2e/fixtures/
gen_composer.py, ...) beside the trained HF model's own save_pretrained
tensors (expected.safetensors) and config (hf_config/): through the mount
transformers loads the view with no missing or unexpected keys, its tensors
are those bytes, and its logits equal, bit for bit, those of the reference
model built in this same run from hf_config/ and expected.safetensors.
(inspect, export and the mount agreeing on each view is test_fixtures'
test_inspect_export_and_mount_agree, which takes every case.json view.)"""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from conftest import TESTDATA, ckptfs
from oracle import assert_view_is

CONFIG_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "num_hidden_layers", "vocab_size", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
               "rope_parameters", "head_dim", "dtype")


def assert_case_view(view, case):
    """The view's tensors are expected.safetensors byte for byte; its
    config.json is the model's; transformers loads it with no missing or
    unexpected keys and the reference model's logits, to the bit."""
    from transformers import AutoConfig
    ours, theirs = AutoConfig.from_pretrained(str(view)), AutoConfig.from_pretrained(str(TESTDATA / case / "hf_config"))
    for k in CONFIG_KEYS:
        assert getattr(ours, k) == getattr(theirs, k), k
    assert_view_is(view, TESTDATA / case / "expected.safetensors", TESTDATA / case / "hf_config" / "config.json")


@pytest.mark.parametrize("case,view", [("composer_llama", "ckpt"), ("composer_llama_sharded", "ckpt/ep0-ba1")])
def test_composer_through_mount(case, view, mount):
    """Composer's monolithic .pt and its sharded DCP (FSDP2, 2 ranks), with
    no config.json beside them: the view's config.json is the HF config
    Composer saved inside (state.integrations.huggingface), under which the
    HuggingFaceModel's attribute prefix (model.) is removed; latest-rank0.pt,
    Composer's link to the same checkpoint, is no second state dict."""
    m = mount(TESTDATA / case)
    v = m.mnt / view
    assert "config.json" in os.listdir(v)
    assert_case_view(v, case)


@pytest.mark.parametrize("case,view,n_optim", [("composer_llama", "ckpt", 63),
                                               ("composer_llama_sharded", "ckpt/ep0-ba1", 63)])
def test_composer_left_out(case, view, n_optim):
    """Optimizer state (state.optimizers.DecoupledAdamW.*) and RNG state are
    never weights: listed as left out, the optimizer's as optimizer state,
    the RNG's as saved outside state.model; --select state.model.model
    shows the HF model under its own names, config or not."""
    src = TESTDATA / case / view
    r = json.loads(ckptfs("inspect", "--json", src).stdout)
    want = set(load_file(str(TESTDATA / case / "expected.safetensors")))
    assert {t["view_name"] for t in r["tensors"] if t.get("view_name")} == want
    left = r["left_out"]
    optim = [o for o in left if o["name"].startswith("state.optimizers.DecoupledAdamW.")]
    assert len(optim) == n_optim and all(o.get("optimizer") and o["reason"] == "optimizer state" for o in optim)
    others = [o for o in left if o not in optim]
    assert others and all(o["name"].startswith("rng.") and "outside the \"state.model\" subtree" in o["reason"]
                          for o in others), others
    assert len(left) == len(r["tensors"]) - len(want)

    r = json.loads(ckptfs("inspect", "--json", "--select", "state.model.model", src).stdout)
    assert {t["view_name"] for t in r["tensors"] if t.get("view_name")} == want
    r = ckptfs("inspect", "--select", "state.model.mod", src, check=False)
    assert r.returncode == 1 and "matches no tensor" in r.stderr


def test_composer_hostile(tmp_path, mount):
    """A Composer folder holding two checkpoints (not one linked twice) is
    said, not guessed at; a config inside that is no JSON config leaves the
    view without one and says why, never a made-up config."""
    src = tmp_path / "src"
    two = src / "two"
    shutil.copytree(TESTDATA / "composer_llama" / "ckpt", two, symlinks=True)
    shutil.copy(two / "ep0-ba1-rank0.pt", two / "ep0-ba2-rank0.pt")
    bad = src / "badcfg"
    bad.mkdir()
    st = torch.load(TESTDATA / "composer_llama" / "ckpt" / "ep0-ba1-rank0.pt", weights_only=False)
    st["state"]["integrations"]["huggingface"]["model"]["config"]["content"]["rms_norm_eps"] = float("nan")
    torch.save(st, bad / "ep0-ba1-rank0.pt")

    m = mount(src)
    note = (m.mnt / "two" / "CKPTFS_INFO.txt").read_text()
    assert "2 torch.save state dicts (ep0-ba1-rank0.pt, ep0-ba2-rank0.pt): a view shows one" in note, note
    names = os.listdir(m.mnt / "badcfg")
    assert "config.json" not in names and "model.safetensors" in names, names
    r = ckptfs("inspect", bad).stdout
    assert "no config.json from the checkpoint" in r and "\"rms_norm_eps\": NaN has no JSON form" in r, r


def test_olmocore_through_mount(mount):
    """OLMo-core's save_model_and_optim_state (FSDP2, 2 gloo ranks; its
    .metadata pickles OLMo-core's own _StorageInfo): with the model's config
    (--hf-config: OLMo-core writes no HF config), the olmo-core-olmo2
    mapping makes OLMo-core's own HF export byte for byte, which loads with
    no missing or unexpected keys and gives the logits of the reference model
    (the export's config and tensors) built in this run, to the bit. The
    optimizer state (optim.*) is listed as optimizer state."""
    case = TESTDATA / "olmocore_llama"
    m = mount(case, "--hf-config", case / "hf_config")
    view = m.mnt / "ckpt"
    model = assert_view_is(view, case / "expected_hf.safetensors", case / "hf_config" / "config.json")
    assert type(model).__name__ == "Olmo2ForCausalLM"

    r = json.loads(ckptfs("inspect", "--json", case / "ckpt").stdout)
    assert r["format"] == "torch-dcp"
    left = r["left_out"]
    assert len(left) == 25 * 3 and all(o["name"].startswith("optim.") and o.get("optimizer") for o in left), left
    r = ckptfs("inspect", case / "ckpt").stdout
    assert "mapped by olmo-core-olmo2" in r and "no config.json: pass --hf-config" in r, r


def test_olmocore_foreign_storage_class(tmp_path):
    """A .metadata whose storage entries are a _StorageInfo of a module no
    reader knows is refused in one line naming the class: nothing of it is
    executed, and nothing is guessed."""
    src = tmp_path / "ck"
    shutil.copytree(TESTDATA / "olmocore_llama" / "ckpt", src)
    meta = (src / ".metadata").read_bytes()
    mod = b"olmo_core.distributed.checkpoint.filesystem"
    (src / ".metadata").write_bytes(meta.replace(mod, b"olmo_cake.distributed.checkpoint.filesystem"))
    r = ckptfs("inspect", src, check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "expected _StorageInfo, got object olmo_cake.distributed.checkpoint.filesystem._StorageInfo" in r.stderr


def test_trainer_fsdp_folder(tmp_path, mount):
    """Trainer's checkpoint-N/ with FSDP (pytorch_model_fsdp_0/ and
    optimizer_0/ written by accelerate's own save_fsdp_model and
    save_fsdp_optimizer on 2 gloo ranks): the folder is the view of the
    model inside, with the folder's config.json, byte for byte the trained
    model's save_pretrained tensors; it loads with no missing or unexpected
    keys and the logits of the reference model built in this run, to the
    bit. pytorch_model_fsdp_0/ is still a view of its own, optimizer_0/ says
    it holds optimizer state only, and a pytorch_model_fsdp_0 that is no
    directory of the folder is refused in one line."""
    case = "trainer_fsdp_llama"
    src = tmp_path / "src"
    shutil.copytree(TESTDATA / case / "ckpt", src)
    bad = src / "checkpoint-2"
    shutil.copytree(src / "checkpoint-1", bad)
    shutil.rmtree(bad / "pytorch_model_fsdp_0")
    (bad / "pytorch_model_fsdp_0").write_text("not a directory")

    m = mount(src)
    view = m.mnt / "checkpoint-1"
    names = set(os.listdir(view))
    assert {"config.json", "model.safetensors.index.json", "pytorch_model_fsdp_0", "optimizer_0",
            "trainer_state.json", "rng_state_0.pth"} <= names, names
    folder_config = TESTDATA / case / "ckpt" / "checkpoint-1" / "config.json"
    assert (view / "config.json").read_bytes() == folder_config.read_bytes()
    assert_case_view(view, case)
    assert "model.safetensors.index.json" in os.listdir(view / "pytorch_model_fsdp_0")
    assert not any(n.endswith(".safetensors") for n in os.listdir(view / "optimizer_0"))

    r = json.loads(ckptfs("inspect", "--json", src / "checkpoint-1").stdout)
    assert r["format"] == "hf-trainer-fsdp" and not r.get("left_out")
    err = (m.mnt / "checkpoint-2" / "CKPTFS_ERROR.txt").read_text()
    assert "pytorch_model_fsdp_0 is not a directory of" in err, err
    r = ckptfs("inspect", bad, check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "is not a directory of" in r.stderr
