// Package layout turns a checkpoint directory into the HF view of it and
// serves the view's bytes: Open detects the format and parses its index,
// Plan lays the tensors out in virtual safetensors files, and each view File
// is an io.ReaderAt that gathers bytes from the shard files on demand.
package layout

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/hfsharded"
	"github.com/ckptfs/ckptfs/layout/megatron"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
)

// Re-exported model types, so library users need only this package.
type (
	Checkpoint = ckpt.Checkpoint
	Tensor     = ckpt.Tensor
	Chunk      = ckpt.Chunk
	Format     = ckpt.Format
)

// Detect reports the format of the checkpoint in dir, reading at most a few
// small files (cheap enough to run on every directory lookup of a mount).
func Detect(dir string) (Format, bool) {
	switch {
	case megatron.Detect(dir):
		return ckpt.FormatMegatron, true
	case torchdcp.Detect(dir):
		return ckpt.FormatTorchDCP, true
	case hfsharded.Detect(dir):
		return ckpt.FormatHFSharded, true
	}
	return "", false
}

// Open parses the checkpoint in dir. A directory that holds consolidated HF
// files beside a sharded/ subdirectory (torch's enable_consolidation) opens
// the sharded copy.
func Open(dir string) (*Checkpoint, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("layout: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("layout: %s is not a directory", dir)
	}
	format, ok := Detect(dir)
	if !ok {
		if sub := filepath.Join(dir, "sharded"); hfsharded.Detect(sub) {
			return hfsharded.Open(sub)
		}
		return nil, fmt.Errorf("layout: %s: no checkpoint found (expected a DCP .metadata, Megatron metadata.json, or shard-*-model-*.safetensors)", dir)
	}
	switch format {
	case ckpt.FormatMegatron:
		return megatron.Open(dir)
	case ckpt.FormatTorchDCP:
		return torchdcp.Open(dir)
	default:
		return hfsharded.Open(dir)
	}
}
