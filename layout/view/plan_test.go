package view

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/hfdir"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/safetensors"
)

func viewNames(t *testing.T, c *ckpt.Checkpoint, opts Options) ([]string, []Omission) {
	t.Helper()
	v, err := Plan(c, opts)
	require.NoError(t, err)
	var names []string
	for _, p := range v.Tensors {
		names = append(names, p.Name)
	}
	return names, v.Omitted
}

// TestSelectionRules: what a view holds comes from the saved nesting, never
// from the look of a name, and every tensor left out is listed with why.
func TestSelectionRules(t *testing.T) {
	// dcp.save({"model": sd, "optimizer": osd, "extra": {...}}): planner_data
	// records the nesting.
	nested := []*ckpt.Tensor{
		treetest.Scalar("model.l1.weight", "model", "l1.weight"),
		treetest.Scalar("model.layers.0.w", "model", "layers", "0", "w"),
		treetest.Scalar("optimizer.state.l1.weight.exp_avg", "optimizer", "state", "l1.weight", "exp_avg"),
		treetest.Scalar("extra.t", "extra", "t"),
	}
	// KempnerForge / torchtitan-style {"model": get_model_state_dict(m),
	// "optimizer": get_optimizer_state_dict(m, opt)}: the model's flat keys
	// are one level under "model".
	kempner := []*ckpt.Tensor{
		treetest.Scalar("model.layers.0.attention.wq.weight", "model", "layers.0.attention.wq.weight"),
		treetest.Scalar("model.output.weight", "model", "output.weight"),
		treetest.Scalar("optimizer.state.layers.0.attention.wq.weight.exp_avg", "optimizer", "state", "layers.0.attention.wq.weight", "exp_avg"),
	}
	// dcp.save(get_model_state_dict(LlamaForCausalLM)): flat keys that
	// happen to start with "model.", saved at the top level.
	flatDCP := []*ckpt.Tensor{
		treetest.Scalar("model.embed_tokens.weight", "model.embed_tokens.weight"),
		treetest.Scalar("model.norm.weight", "model.norm.weight"),
		treetest.Scalar("lm_head.weight", "lm_head.weight"),
	}
	// torchtitan: model keys flattened to the top level, optimizer nested.
	titan := []*ckpt.Tensor{
		treetest.Scalar("tok_embeddings.weight", "tok_embeddings.weight"),
		treetest.Scalar("output.weight", "output.weight"),
		treetest.Scalar("optimizer.state.output.weight.exp_avg", "optimizer", "state", "output.weight", "exp_avg"),
	}
	// HF-sharded / plain safetensors: no nesting information at all.
	hf := []*ckpt.Tensor{
		treetest.Scalar("model.embed_tokens.weight"),
		treetest.Scalar("model.layers.0.mlp.up_proj.weight"),
		treetest.Scalar("lm_head.weight"),
	}
	// Lightning FSDPStrategy(state_dict_type="sharded"): {"model": the
	// LightningModule's state dict, "optimizer_0": its optimizer's}.
	lightningFSDP := []*ckpt.Tensor{
		treetest.Scalar("model.model.model.norm.weight", "model", "model.model.norm.weight"),
		treetest.Scalar("optimizer_0.state.model.model.norm.weight.exp_avg", "optimizer_0", "state", "model.model.norm.weight", "exp_avg"),
	}
	// Composer: {"state": {"model": ..., "optimizers": {"DecoupledAdamW": ...}, "rng": ...}}.
	composer := []*ckpt.Tensor{
		treetest.Scalar("state.model.model.lm_head.weight", "state", "model", "model.lm_head.weight"),
		treetest.Scalar("state.optimizers.DecoupledAdamW.state.model.lm_head.weight.exp_avg",
			"state", "optimizers", "DecoupledAdamW", "state", "model.lm_head.weight", "exp_avg"),
		treetest.Scalar("rng.0.torch", "rng", "0", "torch"),
	}
	// A Lightning .ckpt: {"state_dict": ..., "optimizer_states": [...]}.
	lightning := []*ckpt.Tensor{
		treetest.Scalar("state_dict.model.lm_head.weight", "state_dict", "model.lm_head.weight"),
		treetest.Scalar("optimizer_states.0.state.0.exp_avg", "optimizer_states", "0", "state", "0", "exp_avg"),
	}
	optimizer := Omission{Name: "optimizer.state.l1.weight.exp_avg", Reason: "optimizer state", Optimizer: true}
	cases := []struct {
		name    string
		tensors []*ckpt.Tensor
		sel     string
		want    []string
		omitted []Omission
		err     string
	}{
		{name: "nested: the model subtree", tensors: nested, want: []string{"l1.weight", "layers.0.w"},
			omitted: []Omission{optimizer, {Name: "extra.t", Reason: `saved outside the "model" subtree (under "extra")`}}},
		{name: "nested: --select extra", tensors: nested, sel: "extra", want: []string{"t"},
			omitted: []Omission{
				{Name: "model.l1.weight", Reason: `not under --select "extra"`},
				{Name: "model.layers.0.w", Reason: `not under --select "extra"`},
				optimizer}},
		{name: "nested: --select model.layers", tensors: nested, sel: "model.layers", want: []string{"0.w"}},
		{name: "nested: --select . shows all under saved names", tensors: nested, sel: SelectAll,
			want: []string{"model.l1.weight", "model.layers.0.w", "optimizer.state.l1.weight.exp_avg", "extra.t"}},
		{name: "nested: --select nope", tensors: nested, sel: "nope", err: `--select "nope" matches no tensor`},
		{name: "KempnerForge model+optimizer", tensors: kempner,
			want:    []string{"layers.0.attention.wq.weight", "output.weight"},
			omitted: []Omission{{Name: "optimizer.state.layers.0.attention.wq.weight.exp_avg", Reason: "optimizer state", Optimizer: true}}},
		{name: "flat DCP whose keys start with model.", tensors: flatDCP,
			want: []string{"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}},
		{name: "flat DCP: explicit --select model strips the prefix it names", tensors: flatDCP, sel: "model",
			want:    []string{"embed_tokens.weight", "norm.weight"},
			omitted: []Omission{{Name: "lm_head.weight", Reason: `not under --select "model"`}}},
		{name: "torchtitan: top-level model, nested optimizer", tensors: titan,
			want:    []string{"tok_embeddings.weight", "output.weight"},
			omitted: []Omission{{Name: "optimizer.state.output.weight.exp_avg", Reason: "optimizer state", Optimizer: true}}},
		{name: "HF-sharded: every tensor as saved, lm_head kept", tensors: hf,
			want: []string{"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "lm_head.weight"}},
		{name: "Lightning FSDP: optimizer_0 is optimizer state", tensors: lightningFSDP,
			want:    []string{"model.model.norm.weight"},
			omitted: []Omission{{Name: "optimizer_0.state.model.model.norm.weight.exp_avg", Reason: "optimizer state", Optimizer: true}}},
		{name: "Composer: state.model, optimizers at any level, rng outside", tensors: composer,
			want: []string{"model.lm_head.weight"},
			omitted: []Omission{
				{Name: "state.optimizers.DecoupledAdamW.state.model.lm_head.weight.exp_avg", Reason: "optimizer state", Optimizer: true},
				{Name: "rng.0.torch", Reason: `saved outside the "state.model" subtree (under "rng")`}}},
		{name: "Lightning FSDP: --select model.model reaches into the LightningModule's flat keys", tensors: lightningFSDP,
			sel: "model.model", want: []string{"model.norm.weight"},
			omitted: []Omission{{Name: "optimizer_0.state.model.model.norm.weight.exp_avg", Reason: "optimizer state", Optimizer: true}}},
		{name: "Composer: --select state.model.model reaches into the module's flat keys", tensors: composer, sel: "state.model.model",
			want: []string{"lm_head.weight"},
			omitted: []Omission{
				{Name: "state.optimizers.DecoupledAdamW.state.model.lm_head.weight.exp_avg", Reason: "optimizer state", Optimizer: true},
				{Name: "rng.0.torch", Reason: `not under --select "state.model.model"`}}},
		{name: "Composer: a select inside a flat key stops at its dots", tensors: composer, sel: "state.model.mod",
			err: `--select "state.model.mod" matches no tensor`},
		{name: "Lightning .ckpt: state_dict, optimizer_states", tensors: lightning,
			want:    []string{"model.lm_head.weight"},
			omitted: []Omission{{Name: "optimizer_states.0.state.0.exp_avg", Reason: "optimizer state", Optimizer: true}}},
		{name: "no nesting: an optimizer-looking name is not guessed at", tensors: []*ckpt.Tensor{treetest.Scalar("optimizer.x")},
			want: []string{"optimizer.x"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := treetest.NewCheckpoint(t, t.TempDir(), tc.tensors...)
			if tc.err != "" {
				_, err := Plan(c, Options{Select: tc.sel})
				require.ErrorContains(t, err, tc.err)
				return
			}
			names, omitted := viewNames(t, c, Options{Select: tc.sel})
			require.Equal(t, tc.want, names)
			if tc.omitted != nil || tc.sel == "" {
				require.Equal(t, tc.omitted, omitted)
			}
		})
	}
}

// A checkpoint of optimizer state only (NeMo's optim/) has no view files
// and says why; one whose every tensor is left out for another reason is an
// error, never an empty model.
func TestOptimizerOnly(t *testing.T) {
	c := treetest.NewCheckpoint(t, t.TempDir(),
		treetest.Scalar("optim.state.w.exp_avg", "optim", "state", "w", "exp_avg"),
		treetest.Scalar("optim.state.w.exp_avg_sq", "optim", "state", "w", "exp_avg_sq"))
	v, err := Plan(c, Options{})
	require.NoError(t, err)
	require.Empty(t, v.Files)
	require.Contains(t, v.Note, "no model weights to show: the checkpoint holds 2 tensors of optimizer state")
	require.Len(t, v.Omitted, 2)
	require.Empty(t, v.LeavesOutWeights())

	c = treetest.NewCheckpoint(t, t.TempDir(), treetest.Scalar("extra.t", "extra", "t"), treetest.Scalar("model.w", "model", "w"))
	_, err = Plan(c, Options{Select: "other"})
	require.ErrorContains(t, err, "matches no tensor")
}

func TestSplitAndIndex(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"a":1}`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "train_state.pt"), []byte(`x`), 0o644))
	c := treetest.NewCheckpoint(t, dir)
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		c.Tensors = append(c.Tensors, treetest.Scalar(n, n))
	}
	v, err := Plan(c, Options{MaxShardSize: 16})
	require.NoError(t, err)
	var names []string
	for _, f := range v.Files {
		names = append(names, f.Name)
	}
	require.Equal(t, []string{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
		"model-00003-of-00003.safetensors", hfdir.SafetensorsIndex, "config.json"}, names)
	data, err := io.ReadAll(io.NewSectionReader(v.Lookup(hfdir.SafetensorsIndex), 0, v.Lookup(hfdir.SafetensorsIndex).Size))
	require.NoError(t, err)
	var index struct {
		Metadata  map[string]int64  `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	require.NoError(t, json.Unmarshal(data, &index))
	require.Equal(t, int64(40), index.Metadata["total_size"])
	require.Equal(t, "model-00003-of-00003.safetensors", index.WeightMap["e"])

	// every view file is a valid safetensors file of the planned size
	for _, f := range v.Files[:3] {
		h, err := safetensors.ReadHeader(f, f.Size)
		require.NoError(t, err, f.Name)
		require.Equal(t, map[string]string{"format": "pt"}, h.Metadata)
		require.Zero(t, h.DataStart%8, "header padded to 8 bytes")
	}

	// A checkpoint's own file index wins over the size split.
	c.FileIndex = map[string]int{"a": 2, "b": 1, "c": 2, "d": 1, "e": 1}
	v, err = Plan(c, Options{MaxShardSize: 16})
	require.NoError(t, err)
	require.Equal(t, []string{"b", "d", "e"}, tensorNames(v.Files[0]))
	require.Equal(t, []string{"a", "c"}, tensorNames(v.Files[1]))
}

func tensorNames(f *File) []string {
	var out []string
	for _, p := range f.Placements() {
		out = append(out, p.Name)
	}
	return out
}

func TestHFConfigFallback(t *testing.T) {
	cfg := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(cfg, "config.json"), []byte(`{}`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(cfg, "tokenizer.json"), []byte(`{}`), 0o644))
	c := treetest.NewCheckpoint(t, t.TempDir(), treetest.Scalar("a", "a"))
	v, err := Plan(c, Options{HFConfigDir: cfg})
	require.NoError(t, err)
	require.NotNil(t, v.Lookup("config.json"))
	require.NotNil(t, v.Lookup("tokenizer.json"))
	require.Nil(t, v.Lookup("train_state.pt"))
}

// A view's files carry the time the checkpoint was written: that of its
// index file (DCP's .metadata; for Megatron, the newer of that and
// metadata.json), which each format reader reports, else its directory's.
func TestViewModTimeIsTheIndexFiles(t *testing.T) {
	at := func(s int64) time.Time { return time.Unix(1_700_000_000+s, 0) }
	mtimes := func(t *testing.T, dir string) []time.Time {
		c, err := layout.Open(dir)
		require.NoError(t, err)
		defer c.Close()
		v, err := Plan(c, Options{})
		require.NoError(t, err)
		defer v.closeExtra()
		var out []time.Time
		for _, f := range v.Files {
			if f.Kind != KindPassthrough {
				out = append(out, f.ModTime.UTC())
			}
		}
		require.NotEmpty(t, out)
		return out
	}
	t.Run("dcp", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "ck")
		treetest.CopyFixture(t, "sample", dir)
		require.NoError(t, os.Chtimes(filepath.Join(dir, ".metadata"), at(1), at(1)))
		require.NoError(t, os.Chtimes(dir, at(9), at(9)))
		for _, m := range mtimes(t, dir) {
			assert.Equal(t, at(1).UTC(), m)
		}
	})
	t.Run("megatron", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "ck")
		require.NoError(t, os.CopyFS(dir, os.DirFS(filepath.Join("..", "..", "testdata", "megatron_gpt_llama_tp2", "ckpt", "iter_0000010"))))
		require.NoError(t, os.Chtimes(filepath.Join(dir, ".metadata"), at(1), at(1)))
		require.NoError(t, os.Chtimes(filepath.Join(dir, "metadata.json"), at(2), at(2)))
		for _, m := range mtimes(t, dir) {
			assert.Equal(t, at(2).UTC(), m)
		}
	})
	t.Run("no index file", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "ck")
		require.NoError(t, os.CopyFS(dir, os.DirFS(filepath.Join("..", "..", "testdata", "hf_sharded", "ckpt"))))
		require.NoError(t, os.Chtimes(dir, at(5), at(5)))
		for _, m := range mtimes(t, dir) {
			assert.Equal(t, at(5).UTC(), m)
		}
	})
}
