"""A user's own model through --map: a custom module with fused QKV and
gate/up tensors, saved with torch DCP, loads in transformers as HF Llama
through the mount with the mapping file in e2e/maps/ (the README's
example), with the original model's logits to the bit."""

import json
import shutil
import subprocess
import sys

import torch

from conftest import ROOT, ckptfs

SAVE = r'''
import sys, torch, torch.distributed.checkpoint as dcp
from transformers import LlamaConfig, LlamaForCausalLM
out, ref = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=64, tie_word_embeddings=False)
m = LlamaForCausalLM(cfg).eval()
for n, p in m.named_parameters():
    if n.endswith("norm.weight"):
        p.data.uniform_(0.5, 1.5)
m.save_pretrained(ref)
sd = m.state_dict()
custom = {"tok.weight": sd["model.embed_tokens.weight"], "ln_f.weight": sd["model.norm.weight"], "head.weight": sd["lm_head.weight"]}
for l in range(cfg.num_hidden_layers):
    p = f"model.layers.{l}."
    custom[f"blocks.{l}.ln1.weight"] = sd[p + "input_layernorm.weight"]
    custom[f"blocks.{l}.ln2.weight"] = sd[p + "post_attention_layernorm.weight"]
    custom[f"blocks.{l}.attn.qkv.weight"] = torch.cat([sd[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
    custom[f"blocks.{l}.attn.out.weight"] = sd[p + "self_attn.o_proj.weight"]
    custom[f"blocks.{l}.mlp.fc_in.weight"] = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
    custom[f"blocks.{l}.mlp.fc_out.weight"] = sd[p + "mlp.down_proj.weight"]
dcp.save({k: v.contiguous() for k, v in custom.items()}, checkpoint_id=out)
'''


def logits(path):
    from transformers import AutoModelForCausalLM

    model, loading = AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    with torch.no_grad():
        return model.eval()(torch.tensor([[1, 5, 9, 33, 17, 60, 3]])).logits


def test_map_file_for_a_custom_fused_qkv_model(tmp_path, mount):
    root, ref = tmp_path / "run", tmp_path / "ref"
    subprocess.run([sys.executable, "-c", SAVE, str(root / "ckpt"), str(ref)], check=True, capture_output=True)
    cfg = tmp_path / "cfg"  # the model's config.json alone, for --hf-config
    cfg.mkdir()
    shutil.copy(ref / "config.json", cfg)
    mapfile = ROOT / "e2e" / "maps" / "fused-qkv.json"

    report = json.loads(ckptfs("inspect", "--json", "--map", mapfile, "--hf-config", cfg, root / "ckpt").stdout)
    assert report["mapping"] == "fused-qkv-gpt" and not report.get("left_out")
    q = next(t for t in report["view_tensors"] if t["name"] == "model.layers.1.self_attn.q_proj.weight")
    assert q["sources"] == ["blocks.1.attn.qkv.weight"] and q["shape"] == [32, 32]

    m = mount(root, "--map", mapfile, "--hf-config", cfg)
    assert torch.equal(logits(m.mnt / "ckpt"), logits(ref))  # ref: the original, save_pretrained

    # Without the mapping the view shows the custom names; a mapping whose
    # source is missing is an error naming it, never a partial model.
    r = ckptfs("inspect", "--map", ROOT / "e2e" / "maps" / "fused-qkv.json", ROOT / "testdata" / "sample" / "ckpt", check=False)
    assert r.returncode != 0 and "needs tok.weight, which the checkpoint does not have" in r.stderr
