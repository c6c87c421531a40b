package megatron

import (
	"fmt"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// Args are the scalar training arguments a Megatron-LM checkpoint stores in
// its common state (argparse names): what it records of its model, read
// here and nowhere else.
type Args map[string]any

var _ ckpt.ModelRecord = Args(nil)

// Source says where the arguments come from, for inspect.
func (args Args) Source() string { return "common.pt args" }

// Params reads the model's sizes from the arguments, by the mapping
// language's names (heads, kv_heads, head_dim, hidden, vocab, layers, ffn),
// whether the output projection is tied to the input embeddings, and what
// was assumed.
func (args Args) Params() (p map[string]int64, tied bool, notes []string) {
	p = map[string]int64{}
	num := func(name, arg string) {
		if v, ok := args[arg].(int64); ok && v > 0 {
			p[name] = v
		}
	}
	num("heads", "num_attention_heads")
	num("head_dim", "kv_channels")
	num("hidden", "hidden_size")
	num("vocab", "vocab_size")
	num("layers", "num_layers")
	num("ffn", "ffn_hidden_size")
	if gqa, _ := args["group_query_attention"].(bool); gqa {
		num("kv_heads", "num_query_groups")
	} else if h, ok := p["heads"]; ok {
		p["kv_heads"] = h
	}
	if _, ok := p["head_dim"]; !ok && p["heads"] > 0 && p["hidden"]%p["heads"] == 0 {
		p["head_dim"] = p["hidden"] / p["heads"]
	}
	untie, _ := args["untie_embeddings_and_output_weights"].(bool)
	if padded, ok := args["padded_vocab_size"].(int64); ok && p["vocab"] == 0 && padded > 0 {
		// Megatron pads the vocabulary to a multiple of
		// make_vocab_size_divisible_by × TP; the tokenizer's size is not
		// always recorded. The padded rows are shown then, and said so.
		p["vocab"] = padded
		notes = append(notes, fmt.Sprintf("vocabulary size not recorded: the %d rows Megatron padded it to are shown "+
			"(pass --hf-config DIR with the model's config.json to unpad)", padded))
	}
	return p, !untie, notes
}
