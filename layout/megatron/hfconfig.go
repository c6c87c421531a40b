package megatron

import (
	"encoding/json"
	"fmt"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// HFConfig writes the HF config.json of a Megatron-Core GPT model from the
// arguments its checkpoint stores, for the view the mapping target made:
// LlamaForCausalLM, or Qwen2ForCausalLM when
// Q/K/V have biases, or Qwen3ForCausalLM with QK norms; with MoE layers
// MixtralForCausalLM, Qwen2MoeForCausalLM or Qwen3MoeForCausalLM. It
// refuses (with the reason) what those classes cannot express exactly:
// another activation or norm, learned positions, RoPE scaling, biases on
// other linears, routing HF does not do.
func (args Args) HFConfig(target ckpt.HFTarget) ([]byte, error) {
	return args.hfConfig(target, "Megatron-LM args in common.pt")
}

// hfConfig is HFConfig, saying in the config where the arguments came from.
func (args Args) hfConfig(target ckpt.HFTarget, from string) ([]byte, error) {
	str := func(k string) string { s, _ := args[k].(string); return s }
	flag := func(k string) bool { b, _ := args[k].(bool); return b }
	num := func(k string) (int64, bool) { v, ok := args[k].(int64); return v, ok && v > 0 }
	switch {
	case !flag("swiglu"):
		return nil, fmt.Errorf("the MLP is not SwiGLU")
	case str("normalization") != "RMSNorm":
		return nil, fmt.Errorf("normalization %q is not RMSNorm", str("normalization"))
	case str("position_embedding_type") != "rope":
		return nil, fmt.Errorf("position embeddings %q are not RoPE", str("position_embedding_type"))
	case flag("use_rope_scaling"):
		return nil, fmt.Errorf("RoPE scaling parameters are not recorded")
	case flag("rotary_interleaved"):
		return nil, fmt.Errorf("interleaved RoPE has no HF Llama equivalent")
	case flag("add_bias_linear"):
		return nil, fmt.Errorf("linear layers have biases")
	}
	if p, ok := args["rotary_percent"].(float64); ok && p != 1 {
		return nil, fmt.Errorf("rotary_percent %g is not 1", p)
	}
	p, tied, _ := args.Params()
	cfg := map[string]any{
		"hidden_size":           p["hidden"],
		"intermediate_size":     p["ffn"],
		"num_hidden_layers":     p["layers"],
		"num_attention_heads":   p["heads"],
		"num_key_value_heads":   p["kv_heads"],
		"head_dim":              p["head_dim"],
		"vocab_size":            p["vocab"],
		"hidden_act":            "silu",
		"tie_word_embeddings":   tied,
		"torch_dtype":           "float32",
		"attention_dropout":     0.0,
		"use_cache":             true,
		"ckptfs_generated_from": from,
	}
	for key, arg := range map[string]string{"max_position_embeddings": "max_position_embeddings"} {
		if v, ok := num(arg); ok {
			cfg[key] = v
		}
	}
	for _, k := range []string{"hidden", "ffn", "layers", "heads", "kv_heads", "head_dim"} {
		if _, ok := p[k]; !ok {
			return nil, fmt.Errorf("%s is not recorded", k)
		}
	}
	if eps, ok := args["norm_epsilon"].(float64); ok {
		cfg["rms_norm_eps"] = eps
	}
	if base, ok := num("rotary_base"); ok {
		cfg["rope_theta"] = float64(base)
	} else if base, ok := args["rotary_base"].(float64); ok {
		cfg["rope_theta"] = base
	}
	switch {
	case flag("bf16"):
		cfg["torch_dtype"] = "bfloat16"
	case flag("fp16"):
		cfg["torch_dtype"] = "float16"
	}
	if experts, ok := num("num_experts"); ok {
		if err := moeConfig(cfg, args, experts, target); err != nil {
			return nil, err
		}
		return json.MarshalIndent(cfg, "", "  ")
	}
	switch {
	case flag("qk_layernorm"):
		cfg["architectures"], cfg["model_type"] = []string{"Qwen3ForCausalLM"}, "qwen3"
		cfg["attention_bias"] = flag("add_qkv_bias")
	case flag("add_qkv_bias"):
		cfg["architectures"], cfg["model_type"] = []string{"Qwen2ForCausalLM"}, "qwen2"
	default:
		cfg["architectures"], cfg["model_type"] = []string{"LlamaForCausalLM"}, "llama"
		cfg["attention_bias"], cfg["mlp_bias"] = false, false
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// moeConfig adds to cfg what an HF MoE class needs, for the family the
// mapping target makes: Mixtral, or of the Qwen family Qwen3-MoE (QK norms)
// or Qwen2-MoE (QKV biases and a gated shared expert, which it always has).
func moeConfig(cfg, args map[string]any, experts int64, target ckpt.HFTarget) error {
	str := func(k string) string { s, _ := args[k].(string); return s }
	flag := func(k string) bool { b, _ := args[k].(bool); return b }
	num := func(k string) (int64, bool) { v, ok := args[k].(int64); return v, ok && v > 0 }
	topk, ok := num("moe_router_topk")
	if !ok {
		return fmt.Errorf("moe_router_topk is not recorded")
	}
	ffn, ok := num("moe_ffn_hidden_size")
	if !ok {
		return fmt.Errorf("moe_ffn_hidden_size is not recorded")
	}
	shared, hasShared := num("moe_shared_expert_intermediate_size")
	// Megatron routes by a softmax over the top k logits unless
	// pre-softmax: the same weights as HF's softmax, top k, renormalised.
	switch {
	case str("moe_router_score_function") != "" && str("moe_router_score_function") != "softmax":
		return fmt.Errorf("the router scores by %s, not softmax", str("moe_router_score_function"))
	case flag("moe_router_enable_expert_bias"):
		return fmt.Errorf("the router has an expert bias")
	case args["moe_layer_freq"] != nil && args["moe_layer_freq"] != int64(1):
		return fmt.Errorf("not every layer is an MoE layer (moe_layer_freq %v)", args["moe_layer_freq"])
	}
	if f, ok := args["moe_router_topk_scaling_factor"].(float64); ok && f != 1 {
		return fmt.Errorf("the router scales its top k by %g", f)
	}
	normTopK := !flag("moe_router_pre_softmax")
	delete(cfg, "mlp_bias")
	switch {
	case target.MoE == ckpt.MoEMixtral:
		if hasShared || flag("qk_layernorm") || flag("add_qkv_bias") || !normTopK {
			return fmt.Errorf("shared experts, QK norms, QKV biases or pre-softmax routing have no MixtralForCausalLM equivalent")
		}
		cfg["architectures"], cfg["model_type"] = []string{"MixtralForCausalLM"}, "mixtral"
		cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["intermediate_size"] = experts, topk, ffn
		cfg["output_router_logits"], cfg["sliding_window"] = false, nil
		delete(cfg, "attention_bias")
	case target.MoE == ckpt.MoEQwen && flag("qk_layernorm"):
		if hasShared {
			return fmt.Errorf("Qwen3MoeForCausalLM has no shared experts")
		}
		cfg["architectures"], cfg["model_type"] = []string{"Qwen3MoeForCausalLM"}, "qwen3_moe"
		cfg["attention_bias"] = flag("add_qkv_bias")
	case target.MoE == ckpt.MoEQwen:
		if !hasShared || !flag("moe_shared_expert_gate") || !flag("add_qkv_bias") {
			return fmt.Errorf("Qwen2MoeForCausalLM needs QKV biases and a gated shared expert")
		}
		cfg["architectures"], cfg["model_type"] = []string{"Qwen2MoeForCausalLM"}, "qwen2_moe"
		cfg["shared_expert_intermediate_size"] = shared
	default:
		return fmt.Errorf("the %s mapping makes no MoE model", target.Mapping)
	}
	if target.MoE == ckpt.MoEQwen {
		cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"] = experts, topk, ffn
		cfg["norm_topk_prob"], cfg["decoder_sparse_step"], cfg["mlp_only_layers"] = normTopK, 1, []int{}
		cfg["output_router_logits"] = false
	}
	return nil
}
