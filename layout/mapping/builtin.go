package mapping

import (
	"slices"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// Built-in mappings: a table per model family; of those whose every
// required source exists in a checkpoint, the one that takes the most of
// its tensors applies (Detect). Hyper-parameters come from the view's
// config.json, else from what the checkpoint records (Megatron's args).
var Builtin = []*Spec{megatronGPT, megatronMixtral, megatronQwenMoE, torchtitanQwen3, torchtitanQwen3MoE,
	torchtitanDeepSeekV3, torchtitanLlama, kempnerForgeLlama, litgptLlama, olmoCoreOLMo2}

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
var megatronGPT = &Spec{Name: "megatron-gpt", Rules: megatronDecoder(true, []Rule{
	{To: layer + "mlp.gate_proj.weight", From: Names{"decoder.layers.mlp.linear_fc1.weight"}, Stacked: ByLayer, Split: gateUp(0)},
	{To: layer + "mlp.up_proj.weight", From: Names{"decoder.layers.mlp.linear_fc1.weight"}, Stacked: ByLayer, Split: gateUp(1)},
	{To: layer + "mlp.down_proj.weight", From: Names{"decoder.layers.mlp.linear_fc2.weight"}, Stacked: ByLayer},
})}

// megatronMixtral is Megatron-Core's GPTModel with MoE layers (a router,
// SwiGLU experts, no shared experts; Mixtral's attention) as HF
// MixtralForCausalLM, with Megatron-Bridge's names.
var megatronMixtral = &Spec{Name: "megatron-mixtral", MoE: ckpt.MoEMixtral, Rules: megatronDecoder(false,
	megatronExperts(layer+"block_sparse_moe.", "w1", "w3", "w2"))}

// megatronQwenMoE is the same model as HF Qwen3MoeForCausalLM (QK norms)
// or Qwen2MoeForCausalLM (QKV biases, a gated shared expert): the names
// the two share, with what only one of them has optional.
var megatronQwenMoE = &Spec{Name: "megatron-qwen-moe", MoE: ckpt.MoEQwen, Rules: megatronDecoder(true, append(
	megatronExperts(layer+"mlp.", "gate_proj", "up_proj", "down_proj"),
	Rule{To: layer + "mlp.shared_expert.gate_proj.weight", From: Names{"decoder.layers.mlp.shared_experts.linear_fc1.weight"}, Stacked: ByLayer, Split: gateUp(0), Optional: true},
	Rule{To: layer + "mlp.shared_expert.up_proj.weight", From: Names{"decoder.layers.mlp.shared_experts.linear_fc1.weight"}, Stacked: ByLayer, Split: gateUp(1), Optional: true},
	Rule{To: layer + "mlp.shared_expert.down_proj.weight", From: Names{"decoder.layers.mlp.shared_experts.linear_fc2.weight"}, Stacked: ByLayer, Optional: true},
	Rule{To: layer + "mlp.shared_expert_gate.weight", From: Names{"decoder.layers.mlp.shared_experts.gate_weight"}, Stacked: ByLayer, Optional: true},
))}

// megatronExperts are the rules of an MoE block under prefix: the router,
// and each expert's fused [gate; up] linear_fc1 and its linear_fc2, named
// gate, up and down. torch_dist saves the experts of every layer stacked on
// the axis after the layer's, sequential and grouped-GEMM experts alike;
// with singleton local shards, one tensor per expert.
func megatronExperts(prefix, gate, up, down string) []Rule {
	experts := func(linear string) Names {
		return Names{"decoder.layers.mlp.experts.experts." + linear + ".weight", "decoder.layers.mlp.experts." + linear + ".weight",
			"decoder.layers.mlp.experts.{e}." + linear + ".weight"}
	}
	expert := prefix + "experts.{e}."
	return []Rule{
		{To: prefix + "gate.weight", From: Names{"decoder.layers.mlp.router.weight"}, Stacked: ByLayer},
		{To: expert + gate + ".weight", From: experts("linear_fc1"), Stacked: Axes{"l", "e"}, Split: gateUp(0)},
		{To: expert + up + ".weight", From: experts("linear_fc1"), Stacked: Axes{"l", "e"}, Split: gateUp(1)},
		{To: expert + down + ".weight", From: experts("linear_fc2"), Stacked: Axes{"l", "e"}},
	}
}

// megatronDecoder is a Megatron-Core GPT decoder around the given MLP
// rules: embeddings, attention (fused QKV; with extras, optional biases
// and QK norms, for HF classes that have them), norms and output layer.
func megatronDecoder(extras bool, mlpRules []Rule) []Rule {
	stacked := func(to, from string, optional bool, split *Split) Rule {
		return Rule{To: layer + to, From: Names{from}, Stacked: ByLayer, Split: split, Optional: optional}
	}
	qkvWeight, qkvBias := "decoder.layers.self_attention.linear_qkv.weight", "decoder.layers.self_attention.linear_qkv.bias"
	rules := []Rule{
		{To: "model.embed_tokens.weight", From: Names{"embedding.word_embeddings.weight"}, Rows: "0:vocab"},
		{To: layer + "input_layernorm.weight", Stacked: ByLayer,
			From: Names{"decoder.layers.self_attention.linear_qkv.layer_norm_weight", "decoder.layers.input_layernorm.weight"}},
		stacked("self_attn.q_proj.weight", qkvWeight, false, qkv(0)),
		stacked("self_attn.k_proj.weight", qkvWeight, false, qkv(1)),
		stacked("self_attn.v_proj.weight", qkvWeight, false, qkv(2)),
	}
	if extras {
		rules = append(rules,
			stacked("self_attn.q_proj.bias", qkvBias, true, qkv(0)),
			stacked("self_attn.k_proj.bias", qkvBias, true, qkv(1)),
			stacked("self_attn.v_proj.bias", qkvBias, true, qkv(2)),
			stacked("self_attn.q_norm.weight", "decoder.layers.self_attention.q_layernorm.weight", true, nil),
			stacked("self_attn.k_norm.weight", "decoder.layers.self_attention.k_layernorm.weight", true, nil))
	}
	rules = append(rules,
		stacked("self_attn.o_proj.weight", "decoder.layers.self_attention.linear_proj.weight", false, nil),
		Rule{To: layer + "post_attention_layernorm.weight", Stacked: ByLayer,
			From: Names{"decoder.layers.mlp.linear_fc1.layer_norm_weight", "decoder.layers.pre_mlp_layernorm.weight"}})
	rules = append(rules, mlpRules...)
	return append(rules,
		Rule{To: "model.norm.weight", From: Names{"decoder.final_layernorm.weight"}},
		// Absent when the output layer shares the embeddings.
		Rule{To: "lm_head.weight", From: Names{"output_layer.weight"}, Rows: "0:vocab", Optional: true},
	)
}

// titanDecoder is a torchtitan decoder around the given attention and
// feed-forward rules: embeddings, attention output, norms and output.
func titanDecoder(attention, feedForward []Rule) []Rule {
	rules := append([]Rule{{To: "model.embed_tokens.weight", From: Names{"tok_embeddings.weight"}}}, attention...)
	rules = append(rules,
		Rule{To: layer + "self_attn.o_proj.weight", From: Names{"layers.{l}.attention.wo.weight"}},
		Rule{To: layer + "input_layernorm.weight", From: Names{"layers.{l}.attention_norm.weight"}},
		Rule{To: layer + "post_attention_layernorm.weight", From: Names{"layers.{l}.ffn_norm.weight"}})
	rules = append(rules, feedForward...)
	return append(rules,
		Rule{To: "model.norm.weight", From: Names{"norm.weight"}},
		Rule{To: "lm_head.weight", From: Names{"lm_head.weight", "output.weight"}, UnlessTied: true})
}

// titanAttention is torchtitan's q/k/v (0.3.0 saves wq/wk/wv under
// qkv_linear; older versions directly under attention), q and k permuted
// from the interleaved-pair RoPE order to HF's rotate-half order when rope,
// after the q/k norms when qkNorm.
func titanAttention(rope, qkNorm bool) []Rule {
	titan := func(name string) Names {
		return Names{"layers.{l}.attention.qkv_linear." + name + ".weight", "layers.{l}.attention." + name + ".weight"}
	}
	var rules []Rule
	if qkNorm {
		rules = []Rule{
			{To: layer + "self_attn.q_norm.weight", From: Names{"layers.{l}.attention.q_norm.weight"}},
			{To: layer + "self_attn.k_norm.weight", From: Names{"layers.{l}.attention.k_norm.weight"}},
		}
	}
	q := Rule{To: layer + "self_attn.q_proj.weight", From: titan("wq")}
	k := Rule{To: layer + "self_attn.k_proj.weight", From: titan("wk")}
	if rope {
		q.Permute, k.Permute = &Permute{Rope: "heads"}, &Permute{Rope: "kv_heads"}
	}
	return append(rules, q, k, Rule{To: layer + "self_attn.v_proj.weight", From: titan("wv")})
}

// titanMLP is torchtitan's dense feed-forward block; optional in MoE
// models, where only the dense first layers have it.
func titanMLP(optional bool) []Rule {
	return []Rule{
		{To: layer + "mlp.gate_proj.weight", From: Names{"layers.{l}.feed_forward.w1.weight"}, Optional: optional},
		{To: layer + "mlp.up_proj.weight", From: Names{"layers.{l}.feed_forward.w3.weight"}, Optional: optional},
		{To: layer + "mlp.down_proj.weight", From: Names{"layers.{l}.feed_forward.w2.weight"}, Optional: optional},
	}
}

// titanMoE is torchtitan's MoE block as its state dict adapters' to_hf()
// make it: the router is the gate (followed by routerExtras), and the
// grouped experts, saved stacked [experts, ...] (0.3.0 under
// routed_experts.inner_experts with their axes in the name; older versions
// under experts), become one tensor per expert.
func titanMoE(routerExtras ...Rule) []Rule {
	experts := func(name, older string) Names {
		return Names{"layers.{l}.moe.routed_experts.inner_experts." + name, "layers.{l}.moe.experts." + older}
	}
	rules := append([]Rule{{To: layer + "mlp.gate.weight", From: Names{"layers.{l}.moe.router.gate.weight"}}}, routerExtras...)
	return append(rules,
		Rule{To: layer + "mlp.experts.{e}.gate_proj.weight", From: experts("w1_EFD", "w1"), Stacked: Axes{"e"}},
		Rule{To: layer + "mlp.experts.{e}.up_proj.weight", From: experts("w3_EFD", "w3"), Stacked: Axes{"e"}},
		Rule{To: layer + "mlp.experts.{e}.down_proj.weight", From: experts("w2_EDF", "w2"), Stacked: Axes{"e"}})
}

// torchtitanLlama is torchtitan's Llama 3 as HF LlamaForCausalLM, as its own
// state dict adapter's to_hf() makes it: renames, and q/k rows from the
// interleaved-pair RoPE order to HF's rotate-half order.
var torchtitanLlama = &Spec{Name: "torchtitan-llama", Model: ckpt.ModelLlama, Rules: titanDecoder(titanAttention(true, false), titanMLP(false))}

// torchtitanQwen3 is torchtitan's Qwen3 as HF Qwen3ForCausalLM: renames
// only (Qwen3 rotates halves already), plus the q/k norms.
var torchtitanQwen3 = &Spec{Name: "torchtitan-qwen3", Rules: titanDecoder(titanAttention(false, true), titanMLP(false))}

// torchtitanQwen3MoE is torchtitan's Qwen3 with MoE layers as HF
// Qwen3MoeForCausalLM. Dense layers (mlp_only_layers) keep the dense names.
var torchtitanQwen3MoE = &Spec{Name: "torchtitan-qwen3-moe",
	Rules: titanDecoder(titanAttention(false, true), append(titanMLP(true), titanMoE()...))}

// torchtitanDeepSeekV3 is torchtitan's DeepSeek-V3 as HF
// DeepseekV3ForCausalLM, as its state dict adapter's to_hf() makes it:
// multi-head latent attention (with or without a low-rank query), dense
// first layers, MoE layers with the router's score correction bias, and
// shared experts. Multi-token-prediction layers are not mapped (they are
// listed as left out): HF numbers them after the main layers.
var torchtitanDeepSeekV3 = &Spec{Name: "torchtitan-deepseek-v3", Rules: titanDecoder(
	[]Rule{
		{To: layer + "self_attn.q_a_proj.weight", From: Names{"layers.{l}.attention.wq_a.weight"}, Optional: true},
		{To: layer + "self_attn.q_a_layernorm.weight", From: Names{"layers.{l}.attention.q_norm.weight"}, Optional: true},
		{To: layer + "self_attn.q_b_proj.weight", From: Names{"layers.{l}.attention.wq_b.weight"}, Optional: true},
		{To: layer + "self_attn.q_proj.weight", From: Names{"layers.{l}.attention.wq.weight"}, Optional: true},
		{To: layer + "self_attn.kv_a_proj_with_mqa.weight", From: Names{"layers.{l}.attention.wkv_a.weight"}},
		{To: layer + "self_attn.kv_a_layernorm.weight", From: Names{"layers.{l}.attention.kv_norm.weight"}},
		{To: layer + "self_attn.kv_b_proj.weight", From: Names{"layers.{l}.attention.wkv_b.weight"}},
	},
	slices.Concat(titanMLP(true),
		titanMoE(Rule{To: layer + "mlp.gate.e_score_correction_bias", From: Names{"layers.{l}.moe.expert_bias_E", "layers.{l}.moe.expert_bias"}, Optional: true}),
		[]Rule{
			{To: layer + "mlp.shared_experts.gate_proj.weight", From: Names{"layers.{l}.moe.shared_experts.w1.weight"}, Optional: true},
			{To: layer + "mlp.shared_experts.up_proj.weight", From: Names{"layers.{l}.moe.shared_experts.w3.weight"}, Optional: true},
			{To: layer + "mlp.shared_experts.down_proj.weight", From: Names{"layers.{l}.moe.shared_experts.w2.weight"}, Optional: true},
		}))}

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

// litgptLlama is LitGPT's GPT with LLaMAMLP (Llama, Mistral, ...) as HF
// LlamaForCausalLM, as LitGPT's own convert_lit_checkpoint
// (copy_weights_llama) makes it: renames, and the fused attn.qkv cut into
// [q (heads), k (kv_heads), v (kv_heads)] rows; RoPE is rotate-half already.
var litgptLlama = &Spec{Name: "litgpt-llama", Rules: []Rule{
	{To: "model.embed_tokens.weight", From: Names{"transformer.wte.weight"}},
	{To: layer + "input_layernorm.weight", From: Names{"transformer.h.{l}.norm_1.weight"}},
	{To: layer + "self_attn.q_proj.weight", From: Names{"transformer.h.{l}.attn.qkv.weight"}, Split: litQKV(0)},
	{To: layer + "self_attn.k_proj.weight", From: Names{"transformer.h.{l}.attn.qkv.weight"}, Split: litQKV(1)},
	{To: layer + "self_attn.v_proj.weight", From: Names{"transformer.h.{l}.attn.qkv.weight"}, Split: litQKV(2)},
	{To: layer + "self_attn.o_proj.weight", From: Names{"transformer.h.{l}.attn.proj.weight"}},
	{To: layer + "post_attention_layernorm.weight", From: Names{"transformer.h.{l}.norm_2.weight"}},
	{To: layer + "mlp.gate_proj.weight", From: Names{"transformer.h.{l}.mlp.fc_1.weight"}},
	{To: layer + "mlp.up_proj.weight", From: Names{"transformer.h.{l}.mlp.fc_2.weight"}},
	{To: layer + "mlp.down_proj.weight", From: Names{"transformer.h.{l}.mlp.proj.weight"}},
	{To: "model.norm.weight", From: Names{"transformer.ln_f.weight"}},
	{To: "lm_head.weight", From: Names{"lm_head.weight"}, UnlessTied: true},
}}

// olmoCoreOLMo2 is OLMo-core's Transformer with OLMo 2's block (norms
// after attention and MLP, QK norms over all heads) as HF
// Olmo2ForCausalLM: renames only, as OLMo-core's own HF export
// (olmo_core.nn.hf save_hf_model) makes it.
var olmoCoreOLMo2 = &Spec{Name: "olmo-core-olmo2", Rules: []Rule{
	{To: "model.embed_tokens.weight", From: Names{"embeddings.weight"}},
	{To: layer + "self_attn.q_proj.weight", From: Names{"blocks.{l}.attention.w_q.weight"}},
	{To: layer + "self_attn.k_proj.weight", From: Names{"blocks.{l}.attention.w_k.weight"}},
	{To: layer + "self_attn.v_proj.weight", From: Names{"blocks.{l}.attention.w_v.weight"}},
	{To: layer + "self_attn.o_proj.weight", From: Names{"blocks.{l}.attention.w_out.weight"}},
	{To: layer + "self_attn.q_norm.weight", From: Names{"blocks.{l}.attention.q_norm.weight"}},
	{To: layer + "self_attn.k_norm.weight", From: Names{"blocks.{l}.attention.k_norm.weight"}},
	{To: layer + "post_attention_layernorm.weight", From: Names{"blocks.{l}.attention_norm.weight"}},
	{To: layer + "mlp.gate_proj.weight", From: Names{"blocks.{l}.feed_forward.w1.weight"}},
	{To: layer + "mlp.up_proj.weight", From: Names{"blocks.{l}.feed_forward.w3.weight"}},
	{To: layer + "mlp.down_proj.weight", From: Names{"blocks.{l}.feed_forward.w2.weight"}},
	{To: layer + "post_feedforward_layernorm.weight", From: Names{"blocks.{l}.feed_forward_norm.weight"}},
	{To: "model.norm.weight", From: Names{"lm_head.norm.weight"}},
	{To: "lm_head.weight", From: Names{"lm_head.w_out.weight"}, UnlessTied: true},
}}

// litQKV takes q, k or v of LitGPT's fused qkv rows (one group, not
// interleaved per query group).
func litQKV(take int) *Split {
	return &Split{Sizes: []string{"heads*head_dim", "kv_heads*head_dim", "kv_heads*head_dim"}, Take: take}
}

// Detect returns the built-in mapping whose every required source (rules
// neither optional nor skipped when tied) exists and that takes the most
// of the sources; the first such in Builtin on a tie. A family whose
// models differ by what they add (Mixtral and Qwen3-MoE by QK norms) is so
// told apart by what the checkpoint holds, never by a name's look.
func Detect(sources []Source) *Spec {
	byName := make(map[string]*ckpt.Tensor, len(sources))
	for _, s := range sources {
		byName[s.Name] = s.Tensor
	}
	var best *Spec
	most := 0
	for _, spec := range Builtin {
		if n, ok := spec.matches(byName); ok && n > most {
			best, most = spec, n
		}
	}
	return best
}

// matches reports whether every required source of s exists, and how many
// of the sources its rules take.
func (s *Spec) matches(byName map[string]*ckpt.Tensor) (int, bool) {
	taken := map[string]bool{}
	for _, r := range s.Rules {
		insts, _, err := r.instances(byName, MaxTensors)
		if err != nil || len(insts) == 0 && !r.Optional && !r.UnlessTied {
			return 0, false
		}
		for _, in := range insts {
			taken[in.source] = true
		}
	}
	return len(taken), true
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
