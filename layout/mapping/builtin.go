package mapping

import "github.com/ckptfs/ckptfs/layout/ckpt"

// Built-in mappings: a table per model family, tried in order; the first
// whose every required source exists in a checkpoint applies (Detect).
// Hyper-parameters come from the view's config.json, else from what the
// checkpoint records (Megatron's common.pt args).
var Builtin = []*Spec{megatronGPT, torchtitanQwen3, torchtitanLlama, kempnerForgeLlama}

// layer is shorthand for the names of one decoder layer in HF Llama,
// Qwen2, Qwen3 and Mistral.
const layer = "model.layers.{l}."

// qkv splits Megatron's fused linear_qkv rows, interleaved per query group
// as [q × heads/kv_heads, k, v] × kv_heads (rows are head_dim each).
func qkv(take int) *Split {
	return &Split{Groups: "kv_heads", Sizes: []string{"heads/kv_heads*head_dim", "head_dim", "head_dim"}, Take: take}
}

// gateUp splits Megatron's fused linear_fc1 rows: [gate; up].
func gateUp(take int) *Split { return &Split{Sizes: []string{"rows/2", "rows/2"}, Take: take} }

// megatronGPT is Megatron-Core's GPTModel (local or Transformer Engine
// layer specs, any TP×PP: layers stacked on a leading axis) as HF Llama,
// Qwen2 (QKV bias), Qwen3 (QK norm) or Mistral. The vocabulary is unpadded
// to the HF size; optimizer state (optimizer.*) is never a source here.
var megatronGPT = &Spec{Name: "megatron-gpt", Rules: []Rule{
	{To: "model.embed_tokens.weight", From: Names{"embedding.word_embeddings.weight"}, Rows: "0:vocab"},
	{To: layer + "input_layernorm.weight", Stacked: ByLayer,
		From: Names{"decoder.layers.self_attention.linear_qkv.layer_norm_weight", "decoder.layers.input_layernorm.weight"}},
	{To: layer + "self_attn.q_proj.weight", From: Names{"decoder.layers.self_attention.linear_qkv.weight"}, Stacked: ByLayer, Split: qkv(0)},
	{To: layer + "self_attn.k_proj.weight", From: Names{"decoder.layers.self_attention.linear_qkv.weight"}, Stacked: ByLayer, Split: qkv(1)},
	{To: layer + "self_attn.v_proj.weight", From: Names{"decoder.layers.self_attention.linear_qkv.weight"}, Stacked: ByLayer, Split: qkv(2)},
	{To: layer + "self_attn.q_proj.bias", From: Names{"decoder.layers.self_attention.linear_qkv.bias"}, Stacked: ByLayer, Split: qkv(0), Optional: true},
	{To: layer + "self_attn.k_proj.bias", From: Names{"decoder.layers.self_attention.linear_qkv.bias"}, Stacked: ByLayer, Split: qkv(1), Optional: true},
	{To: layer + "self_attn.v_proj.bias", From: Names{"decoder.layers.self_attention.linear_qkv.bias"}, Stacked: ByLayer, Split: qkv(2), Optional: true},
	{To: layer + "self_attn.q_norm.weight", From: Names{"decoder.layers.self_attention.q_layernorm.weight"}, Stacked: ByLayer, Optional: true},
	{To: layer + "self_attn.k_norm.weight", From: Names{"decoder.layers.self_attention.k_layernorm.weight"}, Stacked: ByLayer, Optional: true},
	{To: layer + "self_attn.o_proj.weight", From: Names{"decoder.layers.self_attention.linear_proj.weight"}, Stacked: ByLayer},
	{To: layer + "post_attention_layernorm.weight", Stacked: ByLayer,
		From: Names{"decoder.layers.mlp.linear_fc1.layer_norm_weight", "decoder.layers.pre_mlp_layernorm.weight"}},
	{To: layer + "mlp.gate_proj.weight", From: Names{"decoder.layers.mlp.linear_fc1.weight"}, Stacked: ByLayer, Split: gateUp(0)},
	{To: layer + "mlp.up_proj.weight", From: Names{"decoder.layers.mlp.linear_fc1.weight"}, Stacked: ByLayer, Split: gateUp(1)},
	{To: layer + "mlp.down_proj.weight", From: Names{"decoder.layers.mlp.linear_fc2.weight"}, Stacked: ByLayer},
	{To: "model.norm.weight", From: Names{"decoder.final_layernorm.weight"}},
	// Absent when the output layer shares the embeddings.
	{To: "lm_head.weight", From: Names{"output_layer.weight"}, Rows: "0:vocab", Optional: true},
}}

// torchtitan's names (0.3.0 saves wq/wk/wv under qkv_linear; older
// versions directly under attention, and the output as "output").
func titan(name string) Names {
	return Names{"layers.{l}.attention.qkv_linear." + name + ".weight", "layers.{l}.attention." + name + ".weight"}
}

// torchtitanLlama is torchtitan's Llama 3 as HF LlamaForCausalLM, as its own
// state dict adapter's to_hf() makes it: renames, and q/k rows from the
// interleaved-pair RoPE order to HF's rotate-half order.
var torchtitanLlama = &Spec{Name: "torchtitan-llama", Rules: []Rule{
	{To: "model.embed_tokens.weight", From: Names{"tok_embeddings.weight"}},
	{To: layer + "self_attn.q_proj.weight", From: titan("wq"), Permute: &Permute{Rope: "heads"}},
	{To: layer + "self_attn.k_proj.weight", From: titan("wk"), Permute: &Permute{Rope: "kv_heads"}},
	{To: layer + "self_attn.v_proj.weight", From: titan("wv")},
	{To: layer + "self_attn.o_proj.weight", From: Names{"layers.{l}.attention.wo.weight"}},
	{To: layer + "input_layernorm.weight", From: Names{"layers.{l}.attention_norm.weight"}},
	{To: layer + "post_attention_layernorm.weight", From: Names{"layers.{l}.ffn_norm.weight"}},
	{To: layer + "mlp.gate_proj.weight", From: Names{"layers.{l}.feed_forward.w1.weight"}},
	{To: layer + "mlp.up_proj.weight", From: Names{"layers.{l}.feed_forward.w3.weight"}},
	{To: layer + "mlp.down_proj.weight", From: Names{"layers.{l}.feed_forward.w2.weight"}},
	{To: "model.norm.weight", From: Names{"norm.weight"}},
	{To: "lm_head.weight", From: Names{"lm_head.weight", "output.weight"}, UnlessTied: true},
}}

// torchtitanQwen3 is torchtitan's Qwen3 as HF Qwen3ForCausalLM: renames
// only (Qwen3 rotates halves already), plus the q/k norms.
var torchtitanQwen3 = &Spec{Name: "torchtitan-qwen3", Rules: append([]Rule{
	{To: layer + "self_attn.q_norm.weight", From: Names{"layers.{l}.attention.q_norm.weight"}},
	{To: layer + "self_attn.k_norm.weight", From: Names{"layers.{l}.attention.k_norm.weight"}},
	{To: layer + "self_attn.q_proj.weight", From: titan("wq")},
	{To: layer + "self_attn.k_proj.weight", From: titan("wk")},
}, withoutRules(torchtitanLlama.Rules, layer+"self_attn.q_proj.weight", layer+"self_attn.k_proj.weight")...)}

// kempnerForgeLlama is KempnerForge's Llama as HF LlamaForCausalLM: renames
// only, as KempnerForge's own HF converter does.
var kempnerForgeLlama = &Spec{Name: "kempnerforge-llama", Rules: []Rule{
	{To: "model.embed_tokens.weight", From: Names{"token_embedding.embedding.weight"}},
	{To: layer + "self_attn.q_proj.weight", From: Names{"layers.{l}.attention.q_proj.weight"}},
	{To: layer + "self_attn.k_proj.weight", From: Names{"layers.{l}.attention.k_proj.weight"}},
	{To: layer + "self_attn.v_proj.weight", From: Names{"layers.{l}.attention.v_proj.weight"}},
	{To: layer + "self_attn.o_proj.weight", From: Names{"layers.{l}.attention.o_proj.weight"}},
	{To: layer + "input_layernorm.weight", From: Names{"layers.{l}.attention_norm.weight"}},
	{To: layer + "post_attention_layernorm.weight", From: Names{"layers.{l}.mlp_norm.weight"}},
	{To: layer + "mlp.gate_proj.weight", From: Names{"layers.{l}.mlp.gate_proj.weight"}},
	{To: layer + "mlp.up_proj.weight", From: Names{"layers.{l}.mlp.up_proj.weight"}},
	{To: layer + "mlp.down_proj.weight", From: Names{"layers.{l}.mlp.down_proj.weight"}},
	{To: "model.norm.weight", From: Names{"norm.weight"}},
	{To: "lm_head.weight", From: Names{"output_head.proj.weight"}, UnlessTied: true},
}}

func withoutRules(rules []Rule, to ...string) []Rule {
	var out []Rule
	for _, r := range rules {
		drop := false
		for _, t := range to {
			drop = drop || r.To == t
		}
		if !drop {
			out = append(out, r)
		}
	}
	return out
}

// Detect returns the first built-in mapping whose every required source
// (rules neither optional nor skipped when tied) exists.
func Detect(sources []Source) *Spec {
	byName := make(map[string]*ckpt.Tensor, len(sources))
	for _, s := range sources {
		byName[s.Name] = s.Tensor
	}
	for _, spec := range Builtin {
		if spec.matches(byName) {
			return spec
		}
	}
	return nil
}

func (s *Spec) matches(byName map[string]*ckpt.Tensor) bool {
	for _, r := range s.Rules {
		if r.Optional || r.UnlessTied {
			continue
		}
		if insts, _, err := r.instances(byName, MaxTensors); err != nil || len(insts) == 0 {
			return false
		}
	}
	return true
}

// ByName returns the built-in mapping of that name.
func ByName(name string) *Spec {
	for _, s := range Builtin {
		if s.Name == name {
			return s
		}
	}
	return nil
}
