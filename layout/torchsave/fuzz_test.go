package torchsave

import (
	"os"
	"testing"

	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

// FuzzOpen opens an arbitrary pytorch_model.bin and reads every tensor it
// shows: errors, never a panic, a hang or an allocation beyond the bounds.
func FuzzOpen(f *testing.F) {
	if b, err := os.ReadFile(treetest.Testdata("torchsave_llama_tied", "ckpt", SingleFile)); err == nil {
		f.Add(b)
	}
	f.Add(model(f, dict(w0())))
	f.Add(withZip64Count(model(f, dict(w0())), 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		treetest.OpenWritten(t, map[string][]byte{SingleFile: b}, OpenTree)
	})
}
