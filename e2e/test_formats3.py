"""Issue 37: checkpoints of every framework a user has. Each case is a
fixture written by the framework's own save code (e2e/fixtures/
gen_statedict.py) beside the HF model's own save_pretrained tensors
(expected.safetensors): through the mount transformers loads it with no
missing or unexpected keys, and its logits equal, bit for bit, those of the
reference model loaded in this same run from config.json and
expected.safetensors; and a directory no reader takes is said, never passed
through in silence."""

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from conftest import TESTDATA, ckptfs
from oracle import INPUT_IDS, assert_same_logits, assert_view_is, view_tensors
from test_frameworks import load

CASES = ["torchsave_statedict_flat", "torchsave_statedict_nested", "lightning_ckpt_llama"]


@pytest.mark.parametrize("case", CASES)
def test_from_pretrained_through_mount_is_bitwise(case, tmp_path, mount):
    m = mount(TESTDATA / case)
    assert_view_is(m.mnt / "ckpt", TESTDATA / case / "expected.safetensors", TESTDATA / case / "ckpt" / "config.json")


def test_lightning_ckpt_report():
    """Lightning's .ckpt: the LightningModule's attribute prefix removed (what
    is under it is the HF model of config.json), optimizer_states left out as
    optimizer state, the callback's tensor as saved outside state_dict,
    hyper_parameters (no tensors) nowhere in the view."""
    import json
    r = json.loads(ckptfs("inspect", "--json", TESTDATA / "lightning_ckpt_llama" / "ckpt").stdout)
    assert r["format"] == "torch-save-state-dict"
    names = {t["name"] for t in r["view_tensors"] or []} or {t["view_name"] for t in r["tensors"] if t.get("view_name")}
    assert names == set(load_file(str(TESTDATA / "lightning_ckpt_llama" / "expected.safetensors")))
    left = {o["name"]: o for o in r["left_out"]}
    optim = [n for n in left if n.startswith("optimizer_states.")]
    assert len(optim) == 63 and all(left[n].get("optimizer") for n in optim)
    others = [o for n, o in left.items() if n not in optim]
    assert len(others) == 1 and others[0]["name"].startswith("callbacks.") and "outside the \"state_dict\"" in others[0]["reason"]
    assert not any("hyper_parameters" in t["name"] for t in r["tensors"])


def test_unrecognised_tensor_files_are_said(tmp_path, mount):
    """A folder of tensor files no reader takes: its files shown as they are,
    a CKPTFS_INFO.txt and one log line naming them and the readers tried;
    inspect fails with the same line."""
    d = tmp_path / "src" / "odd"
    d.mkdir(parents=True)
    torch.save({"step": 3, "rng": [1, 2]}, d / "trainer_state.pt")
    torch.save({"a": torch.ones(2)}, d / "one.pt")
    torch.save({"b": torch.ones(2)}, d / "two.pt")  # two state dicts: which is the model?
    m = mount(tmp_path / "src")
    names = sorted(os.listdir(m.mnt / "odd"))
    assert names == ["CKPTFS_INFO.txt", "one.pt", "trainer_state.pt", "two.pt"]
    note = (m.mnt / "odd" / "CKPTFS_INFO.txt").read_text().strip()
    assert "one.pt, trainer_state.pt, two.pt" in note and "torch-save-state-dict" in note, note
    assert "2 torch.save state dicts (one.pt, two.pt): a view shows one" in note, note
    os.listdir(m.mnt / "odd")
    r = ckptfs("inspect", d, check=False)
    assert r.returncode == 1 and r.stderr.strip().endswith(note), r.stderr
    assert m.output().count("no checkpoint reader takes") == 1, m.output()


@pytest.mark.parametrize("case", ["meta_llama2_mp2", "meta_llama31_mp2"])
def test_meta_original_through_mount(case, mount):
    """Meta's params.json + consolidated.NN.pth (2 model-parallel ranks): the
    view's tensors are byte for byte what transformers' own converter wrote
    (converted/, made by gen_metallama.py), its generated config.json loads
    to the converter's config (rope settings included), and the model loaded
    through the mount gives the converter's model's logits, both loaded in
    this run, to the bit."""
    hf_config = TESTDATA / case / "hf_config"
    if hf_config.is_dir():
        # params.json does not say the rope factor (Llama 3.1 and 3.2 differ):
        # no config is guessed, the view says so, and takes the model's.
        r = ckptfs("inspect", TESTDATA / case / "ckpt")
        assert "no config.json for the view" in r.stdout and "rope_scaling_factor" in r.stdout, r.stdout
        m = mount(TESTDATA / case, "--hf-config", hf_config)
    else:
        m = mount(TESTDATA / case)
    view = m.mnt / "ckpt"
    names = set(os.listdir(view))
    assert "config.json" in names and not any(n.startswith("consolidated.") for n in names), names
    want = load_file(str(TESTDATA / case / "converted" / "model.safetensors"))
    got = view_tensors(view)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k

    from transformers import AutoConfig, AutoModelForCausalLM
    ours, theirs = AutoConfig.from_pretrained(str(view)), AutoConfig.from_pretrained(str(TESTDATA / case / "converted"))
    for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
              "vocab_size", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "rope_parameters"):
        assert getattr(ours, k) == getattr(theirs, k), k
    model, loading = AutoModelForCausalLM.from_pretrained(str(view), dtype=torch.float32, output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    ref = AutoModelForCausalLM.from_pretrained(str(TESTDATA / case / "converted"), dtype=torch.float32).eval()
    ids = torch.tensor(INPUT_IDS)
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, ref(ids).logits)
    report = ckptfs("inspect", TESTDATA / case / "ckpt").stdout
    assert "meta-llama" in report and "mapped by torchtitan-llama" in report


def test_trainer_deepspeed_folder(tmp_path, mount):
    """Trainer's checkpoint-N/ with DeepSpeed: `latest`, global_stepN/ (written
    by DeepSpeed's own engine.save_checkpoint, the deepspeed_zero2_llama
    fixture) and the model's config.json. The folder is the view of what
    `latest` names, with its config.json: transformers loads it with no
    missing or unexpected keys and the logits of the reference model
    (config.json + zero_to_fp32's tensors) loaded in this run, to the bit;
    global_stepN/ is still a view of its own. A `latest` naming a path
    outside the folder is refused in one line."""
    case = TESTDATA / "deepspeed_zero2_llama"
    ck = tmp_path / "src" / "checkpoint-1"
    shutil.copytree(case / "ckpt", ck)
    shutil.copy(case / "hf_config" / "config.json", ck / "config.json")
    (ck / "trainer_state.json").write_text("{}")
    bad = tmp_path / "src" / "checkpoint-2"
    shutil.copytree(ck, bad)
    (bad / "latest").write_text("../checkpoint-1/global_step1")

    m = mount(tmp_path / "src")
    view = m.mnt / "checkpoint-1"
    names = set(os.listdir(view))
    assert {"config.json", "model.safetensors.index.json", "latest", "global_step1", "trainer_state.json"} <= names
    model, loading = load(view)
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    assert_same_logits(model, case / "hf_config" / "config.json", case / "expected.safetensors", torch.tensor(INPUT_IDS) % 120)
    assert "model.safetensors.index.json" in os.listdir(view / "global_step1")

    err = (m.mnt / "checkpoint-2" / "CKPTFS_ERROR.txt").read_text()
    assert "latest names \"../checkpoint-1/global_step1\", not a directory of" in err, err
    r = ckptfs("inspect", bad, check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "not a directory of" in r.stderr


def test_deepspeed_universal_through_mount(tmp_path, mount):
    """DeepSpeed's universal checkpoint (ds_to_universal's zero/<param>/fp32.pt):
    the view holds zero_to_fp32's tensors; with the model's config it loads
    with no missing or unexpected keys and the logits of the reference model
    (config.json + zero_to_fp32's tensors) loaded in this run, to the bit; the
    Adam state files are listed as optimizer state."""
    case = TESTDATA / "deepspeed_universal_llama"
    m = mount(case, "--hf-config", case / "hf_config")
    view = m.mnt / "ckpt"
    assert "zero" not in os.listdir(view)
    model, loading = load(view)
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    assert_same_logits(model, case / "hf_config" / "config.json", case / "expected.safetensors", torch.tensor(INPUT_IDS) % 120)
    import json
    r = json.loads(ckptfs("inspect", "--json", case / "ckpt").stdout)
    assert r["format"] == "deepspeed-universal"
    skipped = [s for s in r["skipped"] if "optimizer state" in s["Reason"]]
    assert len(skipped) == 21 * 3 + 1, r["skipped"]


def test_litgpt_through_mount(tmp_path, mount):
    """LitGPT's lit_model.pth ({"model": state dict}, Fabric's save) and
    model_config.yaml: with the model's config (--hf-config), the view is
    LitGPT's own convert_lit_checkpoint byte for byte (the litgpt-llama
    mapping), loads with no missing or unexpected keys, and gives the logits
    of the reference model (config + the converter's tensors) loaded in this
    run, to the bit. Without a config the names are shown as saved, and the
    view says why."""
    case = TESTDATA / "litgpt_llama"
    r = ckptfs("inspect", case / "ckpt").stdout
    assert "litgpt-llama mapping not applied" in r and "--hf-config" in r, r
    m = mount(case, "--hf-config", case / "hf_config")
    assert_view_is(m.mnt / "ckpt", case / "expected_hf.safetensors", case / "hf_config" / "config.json")


def test_meta_names_in_any_file(tmp_path, mount):
    """A Meta-named state dict in a file of any name (torchtune's Meta
    checkpointer saves torch.save(state_dict) as meta_model_0.pt) beside the
    model's config.json: read as a torch.save state dict, the torchtitan-llama
    mapping (Meta's names) makes the HF names with q/k permuted, byte for byte
    what transformers' own converter wrote for the same tensors, and the
    converter's model's logits in this run, to the bit."""
    case = TESTDATA / "meta_llama2_mp2"
    ck = tmp_path / "src" / "epoch_0"
    ck.mkdir(parents=True)
    torch.save(load_file(str(case / "expected.safetensors")), ck / "meta_model_0.pt")
    shutil.copy(case / "converted" / "config.json", ck / "config.json")
    m = mount(tmp_path / "src")
    view = m.mnt / "epoch_0"
    want = load_file(str(case / "converted" / "model.safetensors"))
    got = view_tensors(view)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k
    from transformers import AutoModelForCausalLM
    model, loading = AutoModelForCausalLM.from_pretrained(str(view), dtype=torch.float32, output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    ref = AutoModelForCausalLM.from_pretrained(str(case / "converted"), dtype=torch.float32).eval()
    ids = torch.tensor(INPUT_IDS)
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, ref(ids).logits)
    r = ckptfs("inspect", ck).stdout
    assert "torch-save-state-dict" in r and "mapped by torchtitan-llama" in r
    assert "rope.freqs" in r and "not used by the torchtitan-llama mapping" in r


def test_save_model_tied_shown_as_save_pretrained(mount):
    """safetensors.torch.save_model of a tied Llama keeps lm_head.weight and
    drops model.embed_tokens.weight: through the mount the file is what
    save_pretrained wrote in the same generator run (config.json ties them),
    inspect says so, transformers loads it with no missing or unexpected key
    and the reference model's logits; --map none shows the file as saved."""
    import json
    case = TESTDATA / "savemodel_llama_tied"
    assert "model.embed_tokens.weight" not in load_file(str(case / "ckpt" / "model.safetensors"))
    r = json.loads(ckptfs("inspect", "--json", case / "ckpt").stdout)
    assert any("holds lm_head.weight and no model.embed_tokens.weight" in w and "as save_pretrained writes it" in w
               for w in r["warnings"]), r["warnings"]
    m = mount(case)
    assert_view_is(m.mnt / "ckpt", case / "expected_hf.safetensors", case / "ckpt" / "config.json")
    raw = json.loads(ckptfs("inspect", "--json", "--map", "none", case / "ckpt").stdout)
    assert {f["name"] for f in raw["view_files"]} >= {"model.safetensors"}
    assert not any("lm_head.weight and no" in w for w in raw.get("warnings") or []), raw.get("warnings")
