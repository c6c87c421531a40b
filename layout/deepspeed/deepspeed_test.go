package deepspeed

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

func copyCase(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join("..", "..", "testdata", name, "ckpt", "global_step1")
	dst := filepath.Join(t.TempDir(), "global_step1")
	require.NoError(t, os.CopyFS(dst, os.DirFS(src)))
	return dst
}

func TestOpenFixtures(t *testing.T) {
	for _, name := range []string{"deepspeed_zero2_llama", "deepspeed_zero3_llama"} {
		c, err := Open(copyCase(t, name))
		require.NoError(t, err, name)
		require.Equal(t, ckpt.FormatDeepSpeed, c.Format)
		require.Len(t, c.Tensors, 21)
		require.Equal(t, "model.embed_tokens.weight", c.Tensors[0].Name)
		require.Equal(t, []int64{120, 48}, c.Tensors[0].Shape)
		c.Close()
	}
}

func replace(t *testing.T, dst, src string) {
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(dst, b, 0o644))
}

// Hostile checkpoints are refused with one line that names the file: at
// open, or (lazy: a rank's file other than rank 0's) on the first read of
// bytes that lie in it.
func TestHostile(t *testing.T) {
	hostile := filepath.Join("..", "..", "testdata", "hostile")
	for _, tc := range []struct {
		name, case_ string
		edit        func(t *testing.T, dir string)
		want        []string
		lazy        bool
	}{
		{"missing rank", "deepspeed_zero2_llama", func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, "zero_pp_rank_1_mp_rank_00_optim_states.pt")))
		}, []string{"zero_pp_rank_1_mp_rank_00_optim_states.pt: missing"}, false},
		{"missing rank zero3", "deepspeed_zero3_llama", func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, "zero_pp_rank_1_mp_rank_00_optim_states.pt")))
		}, []string{"zero_pp_rank_1_mp_rank_00_optim_states.pt: missing"}, false},
		{"rank past partition_count", "deepspeed_zero2_llama", func(t *testing.T, dir string) {
			replace(t, filepath.Join(dir, "zero_pp_rank_2_mp_rank_00_optim_states.pt"), filepath.Join(dir, "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
		}, []string{"zero_pp_rank_2_mp_rank_00_optim_states.pt: not a rank of partition_count 2"}, false},
		{"rank of another stage", "deepspeed_zero2_llama", func(t *testing.T, dir string) {
			replace(t, filepath.Join(dir, "zero_pp_rank_1_mp_rank_00_optim_states.pt"),
				filepath.Join("..", "..", "testdata", "deepspeed_zero3_llama", "ckpt", "global_step1", "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
		}, []string{"zero_pp_rank_1_mp_rank_00_optim_states.pt", "zero_stage"}, true},
		{"param past the partitions", "deepspeed_zero2_llama", func(t *testing.T, dir string) {
			replace(t, filepath.Join(dir, ModelStates), filepath.Join(hostile, "deepspeed_zero2_model_states_past.pt"))
		}, []string{ModelStates, "runs past"}, false},
		{"shapes that do not add up", "deepspeed_zero2_llama", func(t *testing.T, dir string) {
			replace(t, filepath.Join(dir, ModelStates), filepath.Join(hostile, "deepspeed_zero2_model_states_short.pt"))
		}, []string{ModelStates, "do not add up"}, false},
		{"truncated rank file", "deepspeed_zero3_llama", func(t *testing.T, dir string) {
			require.NoError(t, os.Truncate(filepath.Join(dir, "zero_pp_rank_1_mp_rank_00_optim_states.pt"), 5000))
		}, []string{"zero_pp_rank_1_mp_rank_00_optim_states.pt"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyCase(t, tc.case_)
			tc.edit(t, dir)
			c, err := Open(dir)
			if tc.lazy {
				require.NoError(t, err)
				defer c.Close()
				err = readAll(t, c)
			} else {
				require.Nil(t, c)
			}
			require.Error(t, err)
			require.NotContains(t, err.Error(), "\n")
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

// readAll reads every chunk of c; the first error.
func readAll(t *testing.T, c *ckpt.Checkpoint) error {
	for _, tn := range c.Tensors {
		for _, ch := range tn.Chunks.All() {
			if _, err := treetest.ReadChunk(t, tn, ch); err != nil {
				return err
			}
		}
	}
	return nil
}
