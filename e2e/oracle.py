"""The logit oracle, computed where the test runs.

A model loaded through the mount is compared bitwise with a reference model
that transformers builds in the same process from the fixture's original HF
tensors (expected_hf.safetensors, else expected.safetensors) and its
original config. Both run the same torch kernels on the same CPU, so the
comparison is exact on any machine. fp32 kernels round differently between
CPUs and between ATEN_CPU_CAPABILITY levels, so the logits stored in
testdata/ (computed on the machine that wrote the fixture) are only a
cross-check, with a tolerance."""

import functools
import json
import os
import pathlib
import tempfile

import torch
from safetensors.torch import load_file, save_file

from conftest import TESTDATA, case_info

# How far the stored logits may be from this run's reference: kernels of
# other CPUs differ by about 1e-7 on these tiny models; 1e-5 still catches
# a wrong tensor, which moves logits by far more.
CROSS_CHECK_TOLERANCE = 1e-5

# The tensors a padded vocabulary pads (Megatron without its tokenizer's
# size rounds the vocabulary up; its generator checked that the padded rows
# of the output layer are zero).
VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


def original_tensors(case):
    """The case's original tensors under their HF names."""
    d = TESTDATA / case
    path = d / "expected_hf.safetensors"
    if not path.exists():
        path = d / "expected.safetensors"
    tensors = load_file(str(path))
    names = case_info(case).get("hf_key_map")
    if names:
        tensors = {names[k]: v for k, v in tensors.items()}
    return tensors


def original_config(case):
    """The case's original HF config (its own config.json, or the one
    given to the mount with --hf-config)."""
    info = case_info(case)
    return json.loads((TESTDATA / case / (info.get("config_json") or info["hf_config"])).read_text())


def input_ids(case):
    """The case's input: the token ids stored beside its logits."""
    logits = case_info(case)["logits"]
    return load_file(str(TESTDATA / case / (logits if isinstance(logits, str) else logits["file"])))["input_ids"]


def logits_of(config, tensors, ids):
    """fp32 logits on ids of transformers' model of tensors (name → tensor)
    with config (a config.json as a dict), built in this run from a
    directory as save_pretrained writes it."""
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="ckptfs-ref-") as d:
        with open(f"{d}/config.json", "w") as f:
            json.dump(config, f)
        save_file(tensors, f"{d}/model.safetensors", metadata={"format": "pt"})
        model, loading = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True)
        assert not loading["missing_keys"] and not loading["unexpected_keys"], f"the reference: {loading}"
        with torch.no_grad():
            return model.eval()(ids).logits


def assert_same_logits(model, config_path, tensors_path, ids):
    """model's fp32 logits on ids are, to the bit, those of transformers'
    model of the tensors in tensors_path with the config at config_path."""
    with torch.no_grad():
        got = model(ids).logits
    want = logits_of(json.loads(pathlib.Path(config_path).read_text()), load_file(str(tensors_path)), ids)
    assert torch.equal(got, want), f"max |diff| = {(got - want).abs().max().item():.3g}"


# The ids the format tests (test_formats3, test_formats4) run their models on.
INPUT_IDS = [[1, 5, 9, 33, 77, 120, 3, 64],
             [7, 0, 127, 42, 42, 8, 99, 16]]


def view_tensors(view):
    """Every tensor of the view's .safetensors files, by name."""
    got = {}
    for name in sorted(os.listdir(view)):
        if name.endswith(".safetensors"):
            got.update(load_file(str(pathlib.Path(view) / name)))
    return got


def assert_view_is(view, tensors_path, config_path):
    """The view's tensors are those of tensors_path byte for byte (names and
    dtypes too); transformers loads the view with no missing or unexpected
    keys, and the model's logits on INPUT_IDS are, to the bit, those of the
    reference built in this run from config_path and tensors_path. Returns
    the model."""
    from transformers import AutoModelForCausalLM

    want = load_file(str(tensors_path))
    got = view_tensors(view)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k
    model, loading = AutoModelForCausalLM.from_pretrained(str(view), output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    assert_same_logits(model.eval(), config_path, tensors_path, torch.tensor(INPUT_IDS))
    return model


@functools.lru_cache(maxsize=8)
def reference_logits(case, vocab_size):
    """fp32 logits of transformers' model of the original tensors, with the
    vocabulary zero-padded to vocab_size when the view shows it padded."""
    config = original_config(case)
    tensors = original_tensors(case)
    pad = vocab_size - config["vocab_size"]
    assert pad >= 0, f"{case}: the view's vocabulary ({vocab_size}) is smaller than the original's ({config['vocab_size']})"
    if pad:
        for name in VOCAB_TENSORS:
            if name in tensors:
                t = tensors[name]
                tensors[name] = torch.cat([t, t.new_zeros((pad, *t.shape[1:]))])
        config["vocab_size"] = vocab_size
    return logits_of(config, tensors, input_ids(case))


def check_logits(model, case):
    """The model's fp32 logits on the case's input are, to the bit, those of
    the original tensors through transformers in this run; and they are
    within a tolerance of the logits stored when the case was written
    (another CPU's, or another framework's own forward)."""
    ids = input_ids(case)
    with torch.no_grad():
        got = model(ids).logits
    assert got.dtype == torch.float32
    want = reference_logits(case, model.config.vocab_size)
    assert got.shape == want.shape, (got.shape, want.shape)
    if not torch.equal(got, want):
        diff = (got - want).abs().max().item()
        raise AssertionError(f"{case}: logits through the mount differ from the original's in this run: max |diff| = {diff:.3g}")

    stored = case_info(case)["logits"]
    if isinstance(stored, str):
        stored = {"file": stored}
    ref = load_file(str(TESTDATA / case / stored["file"]))["logits"]
    # A vocabulary shown padded has extra logits: the real tokens' are compared.
    diff = (got[..., :ref.shape[-1]] - ref).abs().max().item()
    tolerance = max(CROSS_CHECK_TOLERANCE, stored.get("max_abs_diff_vs_transformers") or 0)
    print(f"{case}: max |logits - stored| = {diff:.3g}")
    assert diff <= tolerance, f"{case}: logits {diff:.3g} from the stored ones (tolerance {tolerance:.3g})"
