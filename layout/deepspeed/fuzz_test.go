package deepspeed

import (
	"maps"
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

// FuzzOpen: a ZeRO checkpoint whose model states file is the input, beside
// the real optimizer partitions: Open and reading every tensor never panic
// or allocate past the files' sizes.
func FuzzOpen(f *testing.F) { fuzzFile(f, "mp_rank_00_model_states.pt") }

// FuzzLazyRank: rank 1's optimizer states file is the input, opened on the
// first read of its bytes: a file that disagrees with rank 0's placement
// fails the read; nothing panics (a box past its partition would).
func FuzzLazyRank(f *testing.F) { fuzzFile(f, "zero_pp_rank_1_mp_rank_00_optim_states.pt") }

func fuzzFile(f *testing.F, states string) {
	fixture := treetest.Testdata("deepspeed_zero2_llama", "ckpt", "global_step1")
	ents, err := os.ReadDir(fixture)
	if err != nil {
		f.Fatal(err) // committed with the code
	}
	files := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(fixture, e.Name()))
		if err != nil {
			f.Fatal(err)
		}
		files[e.Name()] = b
	}
	f.Add(files[states])
	f.Fuzz(func(t *testing.T, b []byte) {
		// Copies of the fixture, not links: a link would leave the tree.
		written := maps.Clone(files)
		written[states] = b
		treetest.OpenWritten(t, written, OpenTree)
	})
}
