package deepspeed

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpen: a ZeRO checkpoint whose model states file is the input, beside
// the real optimizer partitions: Open and reading every tensor never panic
// or allocate past the files' sizes.
func FuzzOpen(f *testing.F) {
	fixture := filepath.Join("..", "..", "testdata", "deepspeed_zero2_llama", "ckpt", "global_step1")
	if b, err := os.ReadFile(filepath.Join(fixture, "mp_rank_00_model_states.pt")); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		ents, err := os.ReadDir(fixture)
		if err != nil {
			t.Skip("no fixture")
		}
		for _, e := range ents { // copies: a symlink would leave the tree
			data, err := os.ReadFile(filepath.Join(fixture, e.Name()))
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		path := filepath.Join(dir, "mp_rank_00_model_states.pt")
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Open(dir)
		if err != nil {
			return
		}
		defer c.Close()
		for _, tn := range c.Tensors {
			if n := tn.ByteSize(); n <= 1<<20 {
				for _, ch := range tn.Chunks {
					buf := make([]byte, n)
					_, _ = ch.Source.ReadAt(buf[:min(n, 4096)], 0)
				}
			}
		}
	})
}
