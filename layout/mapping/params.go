package mapping

import (
	"encoding/json"
	"fmt"
)

// Params are the hyper-parameters a mapping needs: heads, kv_heads,
// head_dim, hidden, vocab, layers, ffn; a name missing is not known.
type Params map[string]int64

// Model is what a mapping needs to know about the model beside its
// tensors.
type Model struct {
	Params Params
	// Tied says the output projection shares the input embeddings.
	Tied bool
	// From says where the parameters came from, for inspect.
	From string
	// Notes say what was assumed, one line each.
	Notes []string
	// Type is config.json's model_type ("" when not read from one).
	Type string
	// TiedSaid says config.json states tie_word_embeddings itself (Tied
	// is then what it says, not PretrainedConfig's default).
	TiedSaid bool
}

// Merge returns m with the parameters of over replacing its own.
func (m Model) Merge(over Model) Model {
	p := Params{}
	for k, v := range m.Params {
		p[k] = v
	}
	for k, v := range over.Params {
		p[k] = v
	}
	out := Model{Params: p, Tied: over.Tied, From: over.From, Type: over.Type, TiedSaid: over.TiedSaid}
	if _, ok := over.Params["vocab"]; !ok {
		out.Notes = m.Notes
	}
	if m.From != "" && over.From != "" {
		out.From = over.From + ", " + m.From
	}
	return out
}

// FromHFConfig reads the parameters from an HF config.json.
func FromHFConfig(data []byte) (Model, error) {
	var c struct {
		Heads   *int64 `json:"num_attention_heads"`
		KV      *int64 `json:"num_key_value_heads"`
		HeadDim *int64 `json:"head_dim"`
		Hidden  *int64 `json:"hidden_size"`
		Vocab   *int64 `json:"vocab_size"`
		Layers  *int64 `json:"num_hidden_layers"`
		FFN     *int64 `json:"intermediate_size"`
		Tied    *bool  `json:"tie_word_embeddings"`
		Type    string `json:"model_type"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return Model{}, fmt.Errorf("config.json: %w", err)
	}
	p := Params{}
	set := func(name string, v *int64) {
		if v != nil && *v > 0 {
			p[name] = *v
		}
	}
	set("heads", c.Heads)
	set("kv_heads", c.KV)
	set("head_dim", c.HeadDim)
	set("hidden", c.Hidden)
	set("vocab", c.Vocab)
	set("layers", c.Layers)
	set("ffn", c.FFN)
	if _, ok := p["kv_heads"]; !ok && c.Heads != nil {
		p["kv_heads"] = p["heads"]
	}
	if _, ok := p["head_dim"]; !ok && p["heads"] > 0 && p["hidden"]%p["heads"] == 0 {
		p["head_dim"] = p["hidden"] / p["heads"]
	}
	// PretrainedConfig ties by default; model configs that do not (Llama)
	// write the key.
	tied := c.Tied == nil || *c.Tied
	return Model{Params: p, Tied: tied, From: "config.json", Type: c.Type, TiedSaid: c.Tied != nil}, nil
}
