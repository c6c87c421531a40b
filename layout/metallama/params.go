package metallama

import (
	"encoding/json"
	"fmt"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
)

// maxParamsBytes bounds params.json.
const maxParamsBytes = 1 << 20

// params is Meta's params.json (llama-models' ModelArgs).
type params struct {
	Dim               int64    `json:"dim"`
	Layers            int64    `json:"n_layers"`
	Heads             int64    `json:"n_heads"`
	KVHeads           *int64   `json:"n_kv_heads"`
	VocabSize         int64    `json:"vocab_size"`
	MultipleOf        *int64   `json:"multiple_of"`
	FFNDimMultiplier  *float64 `json:"ffn_dim_multiplier"`
	NormEps           float64  `json:"norm_eps"`
	RopeTheta         *float64 `json:"rope_theta"`
	UseScaledRope     bool     `json:"use_scaled_rope"`
	RopeScalingFactor *float64 `json:"rope_scaling_factor"`
	Model             *params  `json:"model"` // some releases nest them
	source            string
	kvHeads, headsDim int64
}

// readParams reads and checks params.json.
func readParams(dir source.Tree) (params, error) {
	b, err := source.ReadFile(dir, ParamsFile, maxParamsBytes)
	if err != nil {
		return params{}, fmt.Errorf("metallama: %w", err)
	}
	var p params
	if err := json.Unmarshal(b, &p); err != nil {
		return params{}, fmt.Errorf("%w: metallama: %s: %w", ckpt.ErrInvalid, dir.Path(ParamsFile), err)
	}
	if p.Model != nil {
		p = *p.Model
	}
	p.source = dir.Path(ParamsFile)
	p.kvHeads = p.Heads
	if p.KVHeads != nil {
		p.kvHeads = *p.KVHeads
	}
	const most = 1 << 24
	switch {
	case p.Dim <= 0 || p.Dim > most || p.Layers <= 0 || p.Layers > most || p.Heads <= 0 || p.Heads > most:
		return params{}, fmt.Errorf("%w: metallama: %s: dim %d, n_layers %d, n_heads %d: each must be in 1..%d", ckpt.ErrInvalid, p.source, p.Dim, p.Layers, p.Heads, most)
	case p.Dim%p.Heads != 0 || p.kvHeads <= 0 || p.Heads%p.kvHeads != 0:
		return params{}, fmt.Errorf("%w: metallama: %s: dim %d, n_heads %d, n_kv_heads %d do not divide", ckpt.ErrInvalid, p.source, p.Dim, p.Heads, p.kvHeads)
	}
	p.headsDim = p.Dim / p.Heads
	return p, nil
}

// record is what params.json and the tensors say of the model.
type record struct {
	p     params
	vocab int64 // rows of tok_embeddings
	ffn   int64 // rows of layers.0.feed_forward.w1
	tied  bool  // no output.weight: the output shares the embeddings
}

func newRecord(p params, c *ckpt.Checkpoint) *record {
	r := &record{p: p, tied: true}
	for _, t := range c.Tensors {
		switch t.Name {
		case "tok_embeddings.weight":
			r.vocab = t.Shape[0]
		case "layers.0.feed_forward.w1.weight":
			r.ffn = t.Shape[0]
		case "output.weight":
			r.tied = false
		}
	}
	return r
}

func (r *record) Source() string { return r.p.source }

func (r *record) Params() (map[string]int64, bool, []string) {
	m := map[string]int64{"heads": r.p.Heads, "kv_heads": r.p.kvHeads, "head_dim": r.p.headsDim,
		"hidden": r.p.Dim, "layers": r.p.Layers}
	if r.vocab > 0 {
		m["vocab"] = r.vocab
	}
	if r.ffn > 0 {
		m["ffn"] = r.ffn
	}
	return m, r.tied, nil
}

// intermediateSize is the converter's compute_intermediate_size.
func (r *record) intermediateSize() int64 {
	mult, of := 1.0, int64(256)
	if r.p.FFNDimMultiplier != nil {
		mult = *r.p.FFNDimMultiplier
	}
	if r.p.MultipleOf != nil && *r.p.MultipleOf > 0 {
		of = *r.p.MultipleOf
	}
	return of * ((int64(mult*float64(8*r.p.Dim/3)) + of - 1) / of)
}

// HFConfig writes the LlamaConfig transformers' convert_llama_weights_to_hf
// writes for this checkpoint, from what params.json says: a vocab_size
// there is Llama 3's tiktoken vocabulary (Llama 1/2 say -1 and leave it to
// the tokenizer); use_scaled_rope is Llama 3.1/3.2's llama3 rope scaling,
// whose factor (8 for 3.1, 32 for 3.2) must then be in params.json
// (rope_scaling_factor): Meta's 3.1 and 3.2 files cannot be told apart
// otherwise, so no config is written rather than a guessed one. Llama 1
// cannot be told from Llama 2: the config is Llama 2's (4096 positions;
// 16384 with a larger rope_theta, as Code Llama).
func (r *record) HFConfig(target ckpt.HFTarget) ([]byte, error) {
	if target.Model != ckpt.ModelLlama || target.MoE != "" {
		return nil, fmt.Errorf("%s describes a Llama; the %s mapping makes another model", r.p.source, target.Mapping)
	}
	if got := r.intermediateSize(); r.ffn != got {
		return nil, fmt.Errorf("%s: dim %d, multiple_of and ffn_dim_multiplier give an intermediate size of %d, but feed_forward.w1 has %d rows", r.p.source, r.p.Dim, got, r.ffn)
	}
	llama3 := r.p.VocabSize > 0
	if llama3 && r.p.VocabSize != r.vocab {
		return nil, fmt.Errorf("%s: vocab_size %d, but tok_embeddings has %d rows", r.p.source, r.p.VocabSize, r.vocab)
	}
	if r.p.UseScaledRope && !llama3 {
		return nil, fmt.Errorf("%s: use_scaled_rope without a vocab_size: not a Llama 3.1/3.2 params.json", r.p.source)
	}
	theta := 10000.0
	if r.p.RopeTheta != nil {
		theta = *r.p.RopeTheta
	}
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "hidden_act": "silu",
		"hidden_size": r.p.Dim, "intermediate_size": r.ffn, "num_attention_heads": r.p.Heads,
		"num_hidden_layers": r.p.Layers, "num_key_value_heads": r.p.kvHeads, "rms_norm_eps": r.p.NormEps,
		"vocab_size": r.vocab, "rope_theta": theta, "tie_word_embeddings": r.tied,
		"attention_bias": false, "mlp_bias": false, "head_dim": r.p.headsDim,
	}
	switch {
	case llama3:
		cfg["bos_token_id"], cfg["eos_token_id"], cfg["max_position_embeddings"] = 128000, 128001, 8192
		if r.p.UseScaledRope {
			if r.p.RopeScalingFactor == nil {
				return nil, fmt.Errorf("%s sets use_scaled_rope but no rope_scaling_factor: Llama 3.1 scales by 8, 3.2 by 32, "+
					"and the files do not say which this is (pass --hf-config DIR with the model's config.json)", r.p.source)
			}
			cfg["max_position_embeddings"] = 131072
			cfg["rope_scaling"] = map[string]any{"factor": *r.p.RopeScalingFactor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
				"original_max_position_embeddings": 8192, "rope_type": "llama3"}
		}
	default:
		cfg["bos_token_id"], cfg["eos_token_id"], cfg["max_position_embeddings"] = 1, 2, 4096
		if theta > 10000.0 {
			cfg["max_position_embeddings"] = 16384
		}
	}
	return json.MarshalIndent(cfg, "", "  ")
}
