package megatron

// Megatron-Bridge checkpoints: an iter_N/ directory that is a Megatron-Core
// torch_dist checkpoint whose common state holds no Megatron-LM args; the
// model's configuration is the model section of run_config.yaml, the
// ConfigContainer as OmegaConf writes it (Megatron-Bridge
// training/checkpointing.py; docs/training/checkpointing.md). The section
// is a GPTModelProvider, a TransformerConfig: its field names are mostly
// Megatron-LM's argument names; the others are renamed here so that one
// Args reader (Params, HFConfig) serves both.

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
)

// RunConfigFile is Megatron-Bridge's serialized ConfigContainer.
const RunConfigFile = "run_config.yaml"

// maxRunConfigBytes bounds run_config.yaml (tens of KB in practice).
const maxRunConfigBytes = 4 << 20

// runConfigSame are TransformerConfig fields that are Megatron-LM
// arguments of the same name and meaning.
var runConfigSame = []string{
	"num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "kv_channels", "vocab_size",
	"num_query_groups", "normalization", "position_embedding_type", "rotary_base", "rotary_percent",
	"rotary_interleaved", "add_bias_linear", "add_qkv_bias", "qk_layernorm", "bf16", "fp16",
	"make_vocab_size_divisible_by", "moe_router_topk", "moe_ffn_hidden_size",
	"moe_shared_expert_intermediate_size", "moe_router_score_function", "moe_router_enable_expert_bias",
	"moe_layer_freq", "moe_router_topk_scaling_factor", "moe_router_pre_softmax",
}

// runConfigRenamed are TransformerConfig fields whose Megatron-LM argument
// has another name.
var runConfigRenamed = map[string]string{
	"layernorm_epsilon": "norm_epsilon",
	"seq_length":        "max_position_embeddings",
	"num_moe_experts":   "num_experts",
}

// ropeScalingFields are provider fields that scale RoPE (Llama 3.1's
// provider, linear interpolation): their presence is what Megatron-LM's
// use_rope_scaling says, which HFConfig refuses to guess parameters for.
var ropeScalingFields = []string{"scale_factor", "low_freq_factor", "high_freq_factor", "old_context_len"}

// runConfigRecord is the model a run_config.yaml describes.
type runConfigRecord struct{ args Args }

var _ ckpt.ModelRecord = runConfigRecord{}

func (r runConfigRecord) Source() string { return RunConfigFile + " model" }

func (r runConfigRecord) Params() (map[string]int64, bool, []string) { return r.args.Params() }

func (r runConfigRecord) HFConfig(target ckpt.HFTarget) ([]byte, error) {
	return r.args.hfConfig(target, "Megatron-Bridge "+RunConfigFile)
}

// readRunConfig reads dir's run_config.yaml; ok is false without one.
func readRunConfig(dir source.Tree) (r runConfigRecord, ok bool, err error) {
	if !source.Exists(dir, RunConfigFile) {
		return r, false, nil
	}
	b, err := source.ReadFile(dir, RunConfigFile, maxRunConfigBytes)
	if err != nil {
		return r, true, fmt.Errorf("megatron: %w", err)
	}
	args, err := parseRunConfig(b)
	if err != nil {
		return r, true, fmt.Errorf("megatron: %s: %w", dir.Path(RunConfigFile), err)
	}
	return runConfigRecord{args: args}, true, nil
}

// parseRunConfig returns the Megatron-LM arguments the model section of a
// run_config.yaml stands for.
func parseRunConfig(b []byte) (Args, error) {
	var doc struct {
		Model map[string]any `yaml:"model"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	if doc.Model == nil {
		return nil, fmt.Errorf("no model section")
	}
	m := doc.Model
	args := Args{}
	for _, k := range runConfigSame {
		if v, ok := scalar(m[k]); ok {
			args[k] = v
		}
	}
	for from, to := range runConfigRenamed {
		if v, ok := scalar(m[from]); ok {
			args[to] = v
		}
	}
	if _, ok := args["num_layers"].(int64); !ok {
		return nil, fmt.Errorf("model section has no num_layers: not a GPT model provider (model._target_ %v)", m["_target_"])
	}
	if q, ok := args["num_query_groups"].(int64); ok && q > 0 {
		args["group_query_attention"] = true
	}
	if share, ok := m["share_embeddings_and_output_weights"].(bool); ok {
		args["untie_embeddings_and_output_weights"] = !share
	}
	glu, _ := m["gated_linear_unit"].(bool)
	args["swiglu"] = glu && omegaTarget(m["activation_func"]) == "torch.nn.functional.silu"
	scaled := m["seq_len_interpolation_factor"] != nil
	if b, _ := m["rope_scaling"].(bool); b {
		scaled = true
	}
	for _, k := range ropeScalingFields {
		if _, ok := m[k]; ok {
			scaled = true
		}
	}
	args["use_rope_scaling"] = scaled
	return args, nil
}

// scalar converts a YAML scalar to an argument value (int64, float64,
// bool, string); ok is false for anything else (null, a nested object).
func scalar(v any) (any, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int64:
		return x, true
	case uint64:
		if x <= 1<<62 {
			return int64(x), true
		}
	case float64, bool, string:
		return x, true
	}
	return nil, false
}

// omegaTarget is the _target_ of an OmegaConf object node ("" for anything else).
func omegaTarget(v any) string {
	m, _ := v.(map[string]any)
	s, _ := m["_target_"].(string)
	return s
}

// nemo2Prefix starts every model key of a NeMo 2 checkpoint's weights/
// (NeMo's MegatronParallel saves the model under "module.").
const nemo2Prefix = "module."

// nemo2Note says, for a checkpoint that records no model configuration and
// whose model keys are all under "module." (a NeMo 2 weights/ folder, whose
// configuration is ../context/model.yaml), what is missing and what to
// pass; "" otherwise.
func nemo2Note(c *ckpt.Checkpoint) string {
	n := 0
	for _, t := range c.Tensors {
		if ckpt.IsOptimizerPath(t.Path) {
			continue
		}
		if !strings.HasPrefix(t.Name, nemo2Prefix) {
			return ""
		}
		n++
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("megatron: %s: no model configuration: no Megatron-LM args in the common state and no %s; "+
		"the %d model keys are under %q, as NeMo 2 saves weights/ beside context/ (model.yaml), which ckptfs does not read: "+
		"names shown as saved (pass --select module --hf-config DIR with the model's config.json)", c.Dir, RunConfigFile, n, nemo2Prefix)
}
