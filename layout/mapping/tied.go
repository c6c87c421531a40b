package mapping

import "sort"

// TiedPair is a tied output projection and the input embeddings it
// shares, by HF name.
type TiedPair struct{ Output, Input string }

// tiedByType is transformers' _tied_weights_keys of each model type's
// causal LM class ({output: input}), for the model types the view knows.
var tiedByType = map[string]TiedPair{
	"gpt2":     {"lm_head.weight", "transformer.wte.weight"},
	"gpt_neox": {"lm_head.weight", "gpt_neox.embed_in.weight"},
	"opt":      {"lm_head.weight", "model.decoder.embed_tokens.weight"},
	"falcon":   {"lm_head.weight", "transformer.word_embeddings.weight"},
	"bloom":    {"lm_head.weight", "transformer.word_embeddings.weight"},
}

// decoderTied are the model types whose tie is lm_head.weight to
// model.embed_tokens.weight.
var decoderTied = []string{
	"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
	"gemma3_text", "phi", "phi3", "olmo", "olmo2", "granite", "starcoder2", "deepseek_v3", "cohere",
	"stablelm", "smollm3",
}

func init() {
	for _, t := range decoderTied {
		tiedByType[t] = TiedPair{"lm_head.weight", "model.embed_tokens.weight"}
	}
}

// TiedNames returns the tied pair of an HF model type (config.json's
// model_type); false for a type the table does not know.
func TiedNames(modelType string) (TiedPair, bool) {
	p, ok := tiedByType[modelType]
	return p, ok
}

// TiedPairs lists the pairs of every known model type, each once.
func TiedPairs() []TiedPair {
	seen := map[TiedPair]bool{}
	var out []TiedPair
	for _, p := range tiedByType {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Input < out[j].Input })
	return out
}
