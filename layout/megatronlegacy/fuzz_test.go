package megatronlegacy

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

// FuzzOpen: a TP2 legacy checkpoint whose rank-0 file is the input, beside
// the real rank-1 file: Open and reading every tensor never panic or
// allocate past the files' sizes.
func FuzzOpen(f *testing.F) {
	fixture := treetest.Testdata("megatron_legacy_llama_tp2", "ckpt", "iter_0000010")
	rank0, err := os.ReadFile(filepath.Join(fixture, "mp_rank_00", "model_optim_rng.pt"))
	if err != nil {
		f.Fatal(err) // committed with the code
	}
	f.Add(rank0)
	rank1, err := os.ReadFile(filepath.Join(fixture, "mp_rank_01", "model_optim_rng.pt"))
	if err != nil {
		f.Fatal(err) // committed with the code
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		treetest.OpenWritten(t, map[string][]byte{
			"mp_rank_00/model_optim_rng.pt": b, "mp_rank_01/model_optim_rng.pt": rank1,
		}, OpenTree)
	})
}
