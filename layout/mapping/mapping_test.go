package mapping

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/safetensors"
)

func TestEval(t *testing.T) {
	p := map[string]int64{"heads": 8, "kv_heads": 2, "head_dim": 16}
	for expr, want := range map[string]int64{
		"heads/kv_heads*head_dim": 64, "head_dim": 16, "(heads+kv_heads)*2": 20, "7": 7, " heads - 1 ": 7,
	} {
		got, err := eval(expr, p)
		require.NoError(t, err, expr)
		assert.Equal(t, want, got, expr)
	}
	for expr, msg := range map[string]string{
		"heads/3": "not a multiple", "vocab": "vocab is not known", "heads*": "expected operand", "(heads": "expected ')'",
		"heads/0": "division by zero", "4611686018427387904*4": "overflows", "heads heads": "expected 'EOF'",
		"heads//2": "comment", "heads/*2*/": "comment", "-heads": "only integers, names", "f(heads)": "only integers, names",
		"0x10": "not a decimal integer", "1.5": "not a decimal integer", `"8"`: "not a decimal integer", "010": "leading zero",
		"heads%3": "only + - * /", "heads<<1": "only + - * /", "heads\x00": "illegal character",
		"9223372036854775807+1": "overflows", "0-9223372036854775807-2": "overflows", "99999999999999999999": "out of range",
		strings.Repeat("(", 100) + "1" + strings.Repeat(")", 100): "nested parentheses",
	} {
		_, err := eval(expr, p)
		assert.ErrorContains(t, err, msg, expr)
	}
	_, err := eval("vocab", p)
	var unknown *UnknownParamError
	assert.ErrorAs(t, err, &unknown)
	// A long chain is no deep recursion; past go/parser's nesting bound it
	// is an error, not a crash.
	got, err := eval("1"+strings.Repeat("+heads*2", 50_000), p)
	require.NoError(t, err)
	assert.Equal(t, int64(1+16*50_000), got)
	_, err = eval("1"+strings.Repeat("+1", maxSpecBytes/2), p)
	require.ErrorContains(t, err, "nesting depth")
	assert.Less(t, len(err.Error()), 200, "one line, not the expression")
}

func TestParseRejects(t *testing.T) {
	for doc, msg := range map[string]string{
		`{"name": "x", "tensors": [{"to": "a", "from": "b", "sdplit": {}}]}`:                         `unknown field "sdplit"`,
		`{"name": "x", "tensors": []}`:                                                               "no tensors",
		`{"tensors": [{"to": "a", "from": "b"}]}`:                                                    "no name",
		`{"name": "x", "tensors": [{"to": "l.{l}.w", "from": "w"}]}`:                                 `"{l}" in "to"`,
		`{"name": "x", "tensors": [{"to": "w", "from": "l.{l}.w"}]}`:                                 `"{l}" in "to"`,
		`{"name": "x", "tensors": [{"to": "a", "from": "b", "split": {"sizes": ["1"], "take": 1}}]}`: "split takes part 1 of 1",
		`{"name": "x", "tensors": [{"to": "a", "from": "b", "rows": "5"}]}`:                          `rows "5" is not "start:end"`,
		`{"name": "x", "tensors": [{"to": "a", "from": 7}]}`:                                         "want a name or a list",
		`{"name": "x", "moe": "deepseek", "tensors": [{"to": "a", "from": "b"}]}`:                    `moe "deepseek" is not`,
		`{"name": "x", "model": "qwen3", "tensors": [{"to": "a", "from": "b"}]}`:                     `model "qwen3" is not`,
	} {
		_, err := Parse([]byte(doc))
		assert.ErrorContains(t, err, msg, doc)
	}
	s, err := Parse([]byte(`{"name": "x", "params": {"heads": 2}, "tensors": [{"to": "a", "from": ["b", "c"], "optional": true}]}`))
	require.NoError(t, err)
	assert.Equal(t, Names{"b", "c"}, s.Rules[0].From)
	s, err = Parse([]byte(`{"name": "x", "moe": "mixtral", "tensors": [{"to": "a", "from": "b"}]}`))
	require.NoError(t, err)
	assert.Equal(t, ckpt.MoEMixtral, s.MoE)
}

// The built-in mappings say which HF MoE family their rules make, for the
// config.json a view generates; the dense ones none.
func TestBuiltinMoE(t *testing.T) {
	moe := map[string]string{}
	for _, s := range Builtin {
		require.NoError(t, s.validate(), s.Name)
		if s.MoE != "" {
			moe[s.Name] = s.MoE
		}
	}
	assert.Equal(t, map[string]string{"megatron-mixtral": ckpt.MoEMixtral, "megatron-qwen-moe": ckpt.MoEQwen}, moe)
}

func tensor(name string, shape ...int64) Source {
	return Source{Name: name, Tensor: &ckpt.Tensor{Name: name, DType: safetensors.F32, Shape: shape}}
}

// A fused QKV tensor per layer, stacked: every part and layer is the right
// box; unused sources and tied outputs are reported, never dropped silently.
func TestApply(t *testing.T) {
	spec := &Spec{Name: "t", Rules: []Rule{
		{To: "embed", From: Names{"emb"}, Rows: "0:vocab"},
		{To: "l.{l}.q", From: Names{"qkv"}, Stacked: ByLayer, Split: &Split{Groups: "kv_heads", Sizes: []string{"heads/kv_heads*head_dim", "head_dim", "head_dim"}, Take: 0}},
		{To: "l.{l}.v", From: Names{"qkv"}, Stacked: ByLayer, Split: &Split{Groups: "kv_heads", Sizes: []string{"heads/kv_heads*head_dim", "head_dim", "head_dim"}, Take: 2}},
		{To: "l.{l}.bias", From: Names{"bias"}, Stacked: ByLayer, Optional: true},
		{To: "b.{l}.w", From: Names{"blocks.{l}.w"}, Permute: &Permute{Rope: "heads"}},
		{To: "head", From: Names{"out"}, UnlessTied: true},
	}}
	params := map[string]int64{"heads": 4, "kv_heads": 2, "head_dim": 2, "vocab": 5}
	srcs := []Source{tensor("emb", 8, 3), tensor("qkv", 2, 16, 3), tensor("blocks.0.w", 8, 3), tensor("blocks.10.w", 8, 3),
		tensor("blocks.2.w", 8, 3), tensor("out", 8, 3), tensor("extra", 1)}
	res, err := Apply(spec, srcs, params, true)
	require.NoError(t, err)
	var names []string
	for _, m := range res.Tensors {
		names = append(names, m.Name)
		require.NoError(t, m.Check(), m.Name)
	}
	// layer-major, as a model's state dict is
	assert.Equal(t, []string{"embed", "l.0.q", "l.0.v", "b.0.w", "l.1.q", "l.1.v", "b.2.w", "b.10.w"}, names)
	assert.Equal(t, []string{"extra"}, res.Unused)
	assert.Equal(t, []string{"out"}, res.Tied)

	embed := res.Tensors[0]
	assert.Equal(t, []int64{5, 3}, embed.Shape)
	q1 := res.Tensors[4]
	assert.Equal(t, []int64{8, 3}, q1.Shape)
	require.Len(t, q1.Pieces, 2) // one per kv group
	assert.Equal(t, []int64{1, 0, 0}, q1.Pieces[0].Offsets)
	assert.Equal(t, []int64{1, 8, 0}, q1.Pieces[1].Offsets) // group 1 starts at (2*2+2+2)=8
	assert.Equal(t, []int64{1, 4, 3}, q1.Pieces[1].Sizes)
	v0 := res.Tensors[2]
	assert.Equal(t, []int64{0, 6, 0}, v0.Pieces[0].Offsets)
	assert.Equal(t, []int64{0, 14, 0}, v0.Pieces[1].Offsets)
	// 4 heads of 2 rows: a pair (x, y) is already halves
	assert.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6, 7}, res.Tensors[3].Pieces[0].Rows)

	// untied: the output is made
	res, err = Apply(spec, srcs, params, false)
	require.NoError(t, err)
	assert.Equal(t, "head", res.Tensors[len(res.Tensors)-1].Name)
	assert.Empty(t, res.Tied)
}

func TestRopeHalves(t *testing.T) {
	perm, err := ropeHalves(8, 2) // 2 heads of 4: x0 y0 x1 y1 → x0 x1 y0 y1
	require.NoError(t, err)
	assert.Equal(t, []int64{0, 2, 1, 3, 4, 6, 5, 7}, perm)
}

func TestApplyErrors(t *testing.T) {
	params := map[string]int64{"heads": 4, "kv_heads": 2, "head_dim": 2}
	for _, tc := range []struct {
		rule Rule
		srcs []Source
		msg  string
	}{
		{Rule{To: "a", From: Names{"b"}}, nil, "a needs b, which the checkpoint does not have"},
		{Rule{To: "a", From: Names{"b"}, Split: &Split{Sizes: []string{"3", "3"}, Take: 0}}, []Source{tensor("b", 7, 2)}, "does not cover 7 rows"},
		{Rule{To: "a", From: Names{"b"}, Rows: "0:vocab"}, []Source{tensor("b", 7, 2)}, "vocab is not known"},
		{Rule{To: "a", From: Names{"b"}, Rows: "0:9"}, []Source{tensor("b", 7, 2)}, "rows 0:9 outside 7"},
		{Rule{To: "a", From: Names{"b"}, Permute: &Permute{Rope: "heads"}}, []Source{tensor("b", 6, 2)}, "6 rows are not 4 heads"},
		// Hostile sizes: each sized an allocation or wrapped past a check.
		{Rule{To: "l.{l}.a", From: Names{"b"}, Stacked: ByLayer}, []Source{tensor("b", 1<<40, 0)}, "its slices hold no elements"},
		{Rule{To: "l.{l}.a", From: Names{"b"}, Stacked: ByLayer}, []Source{tensor("b", 1<<20, 1)}, "stacked over 1048576 along axis 0"},
		{Rule{To: "a", From: Names{"b"}, Permute: &Permute{Rope: "heads"}}, []Source{tensor("b", 1<<40, 0)}, "permute of an empty tensor"},
		{Rule{To: "a", From: Names{"b"}, Split: &Split{Sizes: []string{"4611686018427387904", "4611686018427387904",
			"4611686018427387904", "4611686018427387904", "512"}, Take: 4}}, []Source{tensor("b", 512, 2)}, "overflow"},
		{Rule{To: "a", From: Names{"b"}, Split: &Split{Groups: "4611686018427387904", Sizes: []string{"2", "2"}, Take: 0}},
			[]Source{tensor("b", 0x10, 2)}, "does not cover 16 rows"},
	} {
		_, err := Apply(&Spec{Name: "t", Rules: []Rule{tc.rule}}, tc.srcs, params, false)
		assert.ErrorContains(t, err, tc.msg)
	}
	// two rules making one name
	spec := &Spec{Name: "t", Rules: []Rule{{To: "a", From: Names{"b"}}, {To: "a", From: Names{"c"}}}}
	_, err := Apply(spec, []Source{tensor("b", 1), tensor("c", 1)}, params, false)
	assert.ErrorContains(t, err, "two rules make a")
}

func TestDetect(t *testing.T) {
	megatron := []Source{tensor("embedding.word_embeddings.weight", 8, 4), tensor("decoder.layers.self_attention.linear_qkv.weight", 2, 8, 4),
		tensor("decoder.layers.self_attention.linear_qkv.layer_norm_weight", 2, 4), tensor("decoder.layers.self_attention.linear_proj.weight", 2, 4, 4),
		tensor("decoder.layers.mlp.linear_fc1.layer_norm_weight", 2, 4), tensor("decoder.layers.mlp.linear_fc1.weight", 2, 8, 4),
		tensor("decoder.layers.mlp.linear_fc2.weight", 2, 4, 4), tensor("decoder.final_layernorm.weight", 4)}
	assert.Equal(t, "megatron-gpt", Detect(megatron).Name)
	assert.Nil(t, Detect(megatron[1:]), "a required source is missing: no mapping, names as saved")
	assert.Nil(t, Detect([]Source{tensor("model.embed_tokens.weight", 8, 4)}))
}

// FuzzApply parses a mapping and applies it to a checkpoint whose shapes
// come from the input: no panic, no allocation past the bounds, and every
// tensor made is inside its source.
func FuzzApply(f *testing.F) {
	f.Add(`{"name": "x", "tensors": [{"to": "l.{l}.a", "from": "b", "stacked": true, "split": {"sizes": ["rows/2", "rows/2"], "take": 1}}]}`, int64(4), int64(8), int64(2))
	f.Add(`{"name": "x", "tensors": [{"to": "a", "from": "b", "permute": {"rope": "heads"}, "rows": "0:heads*2"}]}`, int64(8), int64(4), int64(0))
	f.Add(`{"name": "x", "tensors": [{"to": "a", "from": "b", "split": {"groups": "heads", "sizes": ["(rows-1)/heads+1"], "take": 0}}]}`, int64(1)<<40, int64(0), int64(3))
	f.Fuzz(func(t *testing.T, doc string, d0, d1, d2 int64) {
		spec, err := Parse([]byte(doc))
		if err != nil {
			return
		}
		shape := []int64{d0, d1, d2}
		if n, err := ckpt.NumElements(shape); err != nil || n > 1<<24 {
			return // Validate rejects such tensors before any mapping sees them
		}
		src := tensor("b", shape...)
		res, err := Apply(spec, []Source{src}, map[string]int64{"heads": 4, "kv_heads": 2}, false)
		if err != nil {
			return
		}
		for _, m := range res.Tensors {
			require.NoError(t, m.Check(), m.Name)
		}
	})
}

// FuzzEval: any expression over the parameters evaluates or fails; never
// panics or recurses without bound.
func FuzzEval(f *testing.F) {
	for _, e := range []string{"heads/kv_heads*head_dim", "(heads+kv_heads)*2", "9223372036854775807+1", "((((1))))", "rows/2-1"} {
		f.Add(e)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		_, _ = eval(expr, map[string]int64{"heads": 8, "kv_heads": 2, "head_dim": 16, "rows": 1 << 62})
	})
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.json")
	require.NoError(t, os.WriteFile(big, make([]byte, maxSpecBytes+1), 0o644))
	for path, msg := range map[string]string{
		big:                           "larger than 1048576 bytes",
		"/dev/zero":                   "not a regular file",
		dir:                           "not a regular file",
		filepath.Join(dir, "missing"): "no such file",
	} {
		_, err := ReadFile(path)
		assert.ErrorContains(t, err, msg, path)
		assert.ErrorContains(t, err, path)
	}
	ok := filepath.Join(dir, "ok.json")
	require.NoError(t, os.WriteFile(ok, []byte(`{"name": "x", "tensors": [{"to": "a", "from": "b"}]}`), 0o644))
	s, err := ReadFile(ok)
	require.NoError(t, err)
	assert.Equal(t, "x", s.Name)
}

// Experts: a layer's experts stacked on dimension 0 (torchtitan), layers
// and experts stacked on dimensions 0 and 1 (Megatron torch_dist), or the
// expert in the name (Megatron's singleton local shards): every expert of
// every layer is its own box, in state-dict order.
func TestApplyExperts(t *testing.T) {
	spec := &Spec{Name: "moe", Rules: []Rule{
		{To: "l.{l}.gate", From: Names{"layers.{l}.router"}},
		{To: "l.{l}.experts.{e}.w1", From: Names{"layers.{l}.w13"}, Stacked: Axes{"e"}, Split: &Split{Sizes: []string{"rows/2", "rows/2"}, Take: 0}},
		{To: "l.{l}.experts.{e}.w3", From: Names{"layers.{l}.w13"}, Stacked: Axes{"e"}, Split: &Split{Sizes: []string{"rows/2", "rows/2"}, Take: 1}},
		{To: "l.{l}.experts.{e}.w2", From: Names{"fc2"}, Stacked: Axes{"l", "e"}},
		{To: "l.{l}.experts.{e}.b", From: Names{"bias.{e}"}, Stacked: ByLayer},
		{To: "l.{l}.norm", From: Names{"layers.{l}.norm"}},
	}}
	srcs := []Source{tensor("layers.0.router", 3, 4), tensor("layers.1.router", 3, 4),
		tensor("layers.0.w13", 3, 10, 4), tensor("layers.1.w13", 3, 10, 4), tensor("fc2", 2, 3, 4, 5),
		tensor("bias.0", 2, 4), tensor("bias.1", 2, 4), tensor("bias.2", 2, 4),
		tensor("layers.0.norm", 4), tensor("layers.1.norm", 4)}
	res, err := Apply(spec, srcs, nil, false)
	require.NoError(t, err)
	var names []string
	for _, m := range res.Tensors {
		names = append(names, m.Name)
		require.NoError(t, m.Check(), m.Name)
	}
	var want []string
	for l := range 2 {
		want = append(want, fmt.Sprintf("l.%d.gate", l))
		for e := range 3 {
			for _, w := range []string{"w1", "w3", "w2", "b"} {
				want = append(want, fmt.Sprintf("l.%d.experts.%d.%s", l, e, w))
			}
		}
		want = append(want, fmt.Sprintf("l.%d.norm", l))
	}
	assert.Equal(t, want, names)
	assert.Empty(t, res.Unused)
	byName := map[string]Tensor{}
	for _, m := range res.Tensors {
		byName[m.Name] = m
	}
	w3 := byName["l.1.experts.2.w3"]
	assert.Equal(t, []int64{5, 4}, w3.Shape)
	assert.Equal(t, "layers.1.w13", w3.Pieces[0].Source.Name)
	assert.Equal(t, []int64{2, 5, 0}, w3.Pieces[0].Offsets)
	assert.Equal(t, []int64{1, 5, 4}, w3.Pieces[0].Sizes)
	assert.Equal(t, "expert 2, part 1 of [rows/2, rows/2]", w3.Transform)
	w2 := byName["l.1.experts.0.w2"]
	assert.Equal(t, []int64{4, 5}, w2.Shape)
	assert.Equal(t, []int64{1, 0, 0, 0}, w2.Pieces[0].Offsets)
	assert.Equal(t, []int64{1, 1, 4, 5}, w2.Pieces[0].Sizes)
	assert.Equal(t, "layer 1, expert 0", w2.Transform)
	b := byName["l.0.experts.2.b"]
	assert.Equal(t, "bias.2", b.Pieces[0].Source.Name)
	assert.Equal(t, []int64{0, 0}, b.Pieces[0].Offsets)

	// Many experts over many layers are counted before they are made.
	_, err = Apply(&Spec{Name: "big", Rules: []Rule{{To: "{l}.{e}", From: Names{"x"}, Stacked: Axes{"l", "e"}}}},
		[]Source{tensor("x", 1<<12, 1<<12, 1)}, nil, false)
	assert.ErrorContains(t, err, "makes more than 262144 tensors")
}

func TestParseIndices(t *testing.T) {
	for doc, msg := range map[string]string{
		`{"name": "x", "tensors": [{"to": "a.{e}", "from": "b", "stacked": true}]}`:           `stacked by "l" needs "{l}" in "to"`,
		`{"name": "x", "tensors": [{"to": "a.{e}", "from": ["b.{e}", "c"]}]}`:                 `"{e}" in "to" needs a source stacked by "e" or "{e}" in "from" "c"`,
		`{"name": "x", "tensors": [{"to": "a.{l}", "from": "b", "stacked": ["l", "l"]}]}`:     `each of "l" and "e" at most once`,
		`{"name": "x", "tensors": [{"to": "a.{l}.{e}", "from": "b", "stacked": ["l", "x"]}]}`: `each of "l" and "e" at most once`,
		`{"name": "x", "tensors": [{"to": "a", "from": "b", "stacked": "yes"}]}`:              `stacked: want true or a list`,
	} {
		_, err := Parse([]byte(doc))
		assert.ErrorContains(t, err, msg, doc)
	}
	s, err := Parse([]byte(`{"name": "x", "tensors": [{"to": "a.{l}.{e}", "from": "b.{e}", "stacked": true}]}`))
	require.NoError(t, err)
	assert.Equal(t, ByLayer, s.Rules[0].Stacked)
	// Experts on an axis, or one per name: one rule covers both forms.
	s, err = Parse([]byte(`{"name": "x", "tensors": [{"to": "a.{l}.{e}", "from": ["b", "c.{e}"], "stacked": ["l", "e"]}]}`))
	require.NoError(t, err)
	for _, srcs := range [][]Source{{tensor("b", 2, 3, 4)}, {tensor("c.0", 2, 4), tensor("c.1", 2, 4), tensor("c.2", 2, 4)}} {
		res, err := Apply(s, srcs, nil, false)
		require.NoError(t, err)
		require.Len(t, res.Tensors, 6)
		assert.Equal(t, "a.1.2", res.Tensors[5].Name)
		assert.Equal(t, []int64{4}, res.Tensors[5].Shape)
	}
}

// Megatron MoE checkpoints become the HF class what they hold says: QK
// norms make Qwen3-MoE, a plain MoE Mixtral; a dense model stays dense.
func TestDetectMoE(t *testing.T) {
	dec := func(names ...string) []Source {
		srcs := []Source{tensor("embedding.word_embeddings.weight", 8, 4), tensor("decoder.layers.self_attention.linear_qkv.weight", 2, 8, 4),
			tensor("decoder.layers.self_attention.linear_qkv.layer_norm_weight", 2, 4), tensor("decoder.layers.self_attention.linear_proj.weight", 2, 4, 4),
			tensor("decoder.final_layernorm.weight", 4)}
		for _, n := range names {
			switch {
			case strings.HasSuffix(n, "experts.linear_fc1.weight"):
				srcs = append(srcs, tensor(n, 2, 3, 6, 4))
			case strings.HasSuffix(n, "experts.linear_fc2.weight"):
				srcs = append(srcs, tensor(n, 2, 3, 4, 3))
			case strings.HasSuffix(n, "router.weight"):
				srcs = append(srcs, tensor(n, 2, 3, 4))
			default:
				srcs = append(srcs, tensor(n, 2, 4))
			}
		}
		return srcs
	}
	moe := []string{"decoder.layers.pre_mlp_layernorm.weight", "decoder.layers.mlp.router.weight",
		"decoder.layers.mlp.experts.experts.linear_fc1.weight", "decoder.layers.mlp.experts.experts.linear_fc2.weight"}
	assert.Equal(t, "megatron-mixtral", Detect(dec(moe...)).Name)
	qwen3 := append(moe, "decoder.layers.self_attention.q_layernorm.weight", "decoder.layers.self_attention.k_layernorm.weight")
	spec := Detect(dec(qwen3...))
	assert.Equal(t, "megatron-qwen-moe", spec.Name)
	res, err := Apply(spec, dec(qwen3...), map[string]int64{"heads": 2, "kv_heads": 1, "head_dim": 2, "vocab": 8}, true)
	require.NoError(t, err)
	assert.Empty(t, res.Unused)
	assert.Len(t, res.Tensors, 1+2*(1+3+1+1+1+1+1+3*3)+1) // embed, per layer: norm, q/k/v, q/k norms, o, norm, gate, 3 experts × 3; norm
	assert.Equal(t, "model.layers.1.mlp.experts.2.down_proj.weight", res.Tensors[len(res.Tensors)-2].Name)

}

// TestHFModel: names are an HF model of the tables when every name is one
// a rule makes for that many layers and every required one is there.
func TestHFModel(t *testing.T) {
	var llama []string
	for l := range 2 {
		for _, n := range []string{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
			"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"} {
			llama = append(llama, fmt.Sprintf("model.layers.%d.%s.weight", l, n))
		}
	}
	llama = append(llama, "model.embed_tokens.weight", "model.norm.weight")
	untied := append(slices.Clone(llama), "lm_head.weight")
	require.NotNil(t, HFModel(untied, 2, false))
	require.NotNil(t, HFModel(llama, 2, true), "tied: no lm_head")
	require.Nil(t, HFModel(slices.DeleteFunc(slices.Clone(untied), func(n string) bool { return strings.HasPrefix(n, "model.layers.1.mlp.up") }), 2, false),
		"a tensor of a layer missing")
	require.Nil(t, HFModel(untied, 3, false), "a layer missing")
	require.Nil(t, HFModel(untied, 1, false), "a layer too many")
	require.Nil(t, HFModel(append(slices.Clone(untied), "model.extra"), 2, false))
	require.Nil(t, HFModel(untied, 0, false))
	moe := slices.DeleteFunc(slices.Clone(untied), func(n string) bool { return strings.Contains(n, ".mlp.") })
	for l := range 2 {
		moe = append(moe, fmt.Sprintf("model.layers.%d.block_sparse_moe.gate.weight", l))
		for e := range 2 {
			for _, w := range []string{"w1", "w2", "w3"} {
				moe = append(moe, fmt.Sprintf("model.layers.%d.block_sparse_moe.experts.%d.%s.weight", l, e, w))
			}
		}
	}
	require.Equal(t, "megatron-mixtral", HFModel(moe, 2, false).Name)
}

// Parsed expressions are kept, their values are not: the same expression
// over other parameters, and a refused one read again.
func TestEvalParsedOnce(t *testing.T) {
	for _, heads := range []int64{8, 64, 8} {
		v, err := eval("heads/kv*dim", map[string]int64{"heads": heads, "kv": 4, "dim": 128})
		require.NoError(t, err)
		require.Equal(t, heads/4*128, v)
	}
	for range 2 {
		_, err := eval("heads//2", map[string]int64{"heads": 8})
		require.ErrorContains(t, err, "a comment")
		_, err = eval("heads-", nil)
		require.ErrorContains(t, err, `expression "heads-"`)
	}
	_, ok := parsed.m["heads/kv*dim"]
	require.True(t, ok, "parsed once")
}
