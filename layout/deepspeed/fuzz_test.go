package deepspeed

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

// FuzzOpen: a ZeRO checkpoint whose model states file is the input, beside
// the real optimizer partitions: Open and reading every tensor never panic
// or allocate past the files' sizes.
func FuzzOpen(f *testing.F) {
	const states = "mp_rank_00_model_states.pt"
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
		dir := t.TempDir()
		for name, data := range files { // copies: a symlink would leave the tree
			if name == states {
				data = b
			}
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		c, err := Open(dir)
		if err != nil {
			return
		}
		defer c.Close()
		treetest.ReadChunks(t, c)
	})
}
