package torchsave

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpen opens an arbitrary pytorch_model.bin and reads every tensor it
// shows: errors, never a panic, a hang or an allocation beyond the bounds.
func FuzzOpen(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "torchsave_llama_tied", "ckpt", SingleFile)); err == nil {
		f.Add(b)
	}
	f.Add(model(f, dict(w0())))
	f.Add(withZip64Count(model(f, dict(w0())), 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, SingleFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Open(dir)
		if err != nil {
			return
		}
		defer c.Close()
		for _, tn := range c.Tensors {
			if n := tn.ByteSize(); n <= 1<<20 {
				buf := make([]byte, n)
				_, _ = tn.Chunks[0].Source.ReadAt(buf, 0)
			}
		}
	})
}
