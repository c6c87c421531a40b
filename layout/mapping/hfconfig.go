package mapping

import (
	"encoding/json"
	"fmt"
)

// MegatronHFConfig writes the HF config.json of a Megatron-Core GPT model
// from the arguments its checkpoint stores: LlamaForCausalLM, or
// Qwen2ForCausalLM when Q/K/V have biases, or Qwen3ForCausalLM with QK
// norms. It refuses (with the reason) what those classes cannot express
// exactly: another activation or norm, learned positions, RoPE scaling,
// biases on other linears.
func MegatronHFConfig(args map[string]any, vocab int64) ([]byte, error) {
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
	m := FromMegatronArgs(args)
	cfg := map[string]any{
		"hidden_size":           m.Params["hidden"],
		"intermediate_size":     m.Params["ffn"],
		"num_hidden_layers":     m.Params["layers"],
		"num_attention_heads":   m.Params["heads"],
		"num_key_value_heads":   m.Params["kv_heads"],
		"head_dim":              m.Params["head_dim"],
		"vocab_size":            vocab,
		"hidden_act":            "silu",
		"tie_word_embeddings":   m.Tied,
		"torch_dtype":           "float32",
		"attention_dropout":     0.0,
		"use_cache":             true,
		"ckptfs_generated_from": "Megatron-LM args in common.pt",
	}
	for key, arg := range map[string]string{"max_position_embeddings": "max_position_embeddings"} {
		if v, ok := num(arg); ok {
			cfg[key] = v
		}
	}
	for _, k := range []string{"hidden", "ffn", "layers", "heads", "kv_heads", "head_dim"} {
		if _, ok := m.Params[k]; !ok {
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
