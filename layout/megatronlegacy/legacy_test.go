package megatronlegacy

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/megatron"
)

// copyCase copies testdata/<name>/ckpt/iter_0000010 to a temp dir.
func copyCase(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join("..", "..", "testdata", name, "ckpt", "iter_0000010")
	dst := filepath.Join(t.TempDir(), "iter_0000010")
	require.NoError(t, os.CopyFS(dst, os.DirFS(src)))
	return dst
}

func TestOpenFixtures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layers int64
	}{{"megatron_legacy_llama_tp2", 2}, {"megatron_legacy_llama_tp2pp2", 2}} {
		c, err := Open(copyCase(t, tc.name))
		require.NoError(t, err, tc.name)
		require.Equal(t, ckpt.FormatMegatronLegacy, c.Format)
		byName := map[string]*ckpt.Tensor{}
		for _, x := range c.Tensors {
			byName[x.Name] = x
		}
		require.Equal(t, []int64{tc.layers, 192, 48}, byName["decoder.layers.mlp.linear_fc1.weight"].Shape)
		require.Equal(t, []int64{tc.layers, 48, 48}, byName["decoder.layers.self_attention.linear_proj.weight"].Shape)
		require.Equal(t, []int64{128, 48}, byName["embedding.word_embeddings.weight"].Shape)
		require.EqualValues(t, 2, c.Record.(megatron.Args)["tensor_model_parallel_size"])
		var skipped []string
		for _, s := range c.Skipped {
			skipped = append(skipped, s.Name)
			require.Contains(t, s.Reason, "_extra_state")
		}
		require.Contains(t, skipped, "output_layer._extra_state")
		c.Close()
	}
}

// Hostile checkpoints are refused with one line that names the file.
func TestHostile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(t *testing.T, dir string)
		case_ string
		want  []string
	}{
		{"missing rank", func(t *testing.T, dir string) {
			require.NoError(t, os.RemoveAll(filepath.Join(dir, "mp_rank_01")))
		}, "megatron_legacy_llama_tp2", []string{"mp_rank_01/model_optim_rng.pt: missing"}},
		{"missing first rank", func(t *testing.T, dir string) {
			require.NoError(t, os.RemoveAll(filepath.Join(dir, "mp_rank_00_000")))
		}, "megatron_legacy_llama_tp2pp2", []string{"mp_rank_00_000/model_optim_rng.pt: missing"}},
		{"missing stage", func(t *testing.T, dir string) {
			require.NoError(t, os.RemoveAll(filepath.Join(dir, "mp_rank_01_001")))
		}, "megatron_legacy_llama_tp2pp2", []string{"mp_rank_01_001/model_optim_rng.pt: missing"}},
		{"rank past the sizes", func(t *testing.T, dir string) {
			require.NoError(t, os.CopyFS(filepath.Join(dir, "mp_rank_02"), os.DirFS(filepath.Join(dir, "mp_rank_01"))))
		}, "megatron_legacy_llama_tp2", []string{"mp_rank_02: not a rank of tensor_model_parallel_size 2"}},
		{"stage with other layers", func(t *testing.T, dir string) {
			other := filepath.Join("..", "..", "testdata", "megatron_legacy_llama_tp2", "ckpt", "iter_0000010", "mp_rank_01", RankFile)
			b, err := os.ReadFile(other)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, "mp_rank_01_001", RankFile), b, 0o644))
		}, "megatron_legacy_llama_tp2pp2", []string{"mp_rank_01_001/model_optim_rng.pt", "holds 2 layers"}},
		{"shapes that do not add up", func(t *testing.T, dir string) {
			// rank 1 of stage 0 replaced by rank 0 of a TP=1-sized stage: the
			// TP=2 file of the other case has other local shapes
			other := filepath.Join("..", "..", "testdata", "megatron_legacy_llama_tp2pp2", "ckpt", "iter_0000010", "mp_rank_01_000", RankFile)
			b, err := os.ReadFile(other)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, "mp_rank_01", RankFile), b, 0o644))
		}, "megatron_legacy_llama_tp2", []string{"mp_rank_01/model_optim_rng.pt"}},
		{"truncated rank file", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "mp_rank_01", RankFile)
			require.NoError(t, os.Truncate(p, 1000))
		}, "megatron_legacy_llama_tp2", []string{"mp_rank_01/model_optim_rng.pt"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyCase(t, tc.case_)
			tc.edit(t, dir)
			c, err := Open(dir)
			require.Error(t, err)
			require.Nil(t, c)
			msg := err.Error()
			require.NotContains(t, msg, "\n")
			for _, w := range tc.want {
				require.Contains(t, msg, w)
			}
		})
	}
}
