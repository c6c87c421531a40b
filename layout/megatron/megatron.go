// Package megatron reads Megatron-Core dist_checkpointing checkpoints saved
// with the torch_dist backend: a DCP checkpoint (.metadata + *.distcp, keys
// are the ShardedTensor keys as stored) plus a metadata.json naming the
// backend. The .metadata root may be Megatron's MCoreMetadata; torchdcp
// decodes it as Metadata.
package megatron

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
)

// ConfigFile is Megatron's checkpoint config (CheckpointingConfig as JSON).
const ConfigFile = "metadata.json"

// maxConfigBytes bounds metadata.json; the real one is ~150 bytes.
const maxConfigBytes = 1 << 20

// Config is the part of metadata.json ckptfs reads.
type Config struct {
	ShardedBackend string `json:"sharded_backend"`
}

// ReadConfig reads dir/metadata.json.
func ReadConfig(dir string) (Config, error) {
	var c Config
	f, err := os.Open(filepath.Join(dir, ConfigFile))
	if err != nil {
		return c, fmt.Errorf("megatron: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return c, fmt.Errorf("megatron: %w", err)
	}
	if len(b) > maxConfigBytes {
		return c, fmt.Errorf("megatron: %s larger than %d bytes", f.Name(), maxConfigBytes)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("megatron: %s: %w", f.Name(), err)
	}
	return c, nil
}

// Detect reports whether dir is a Megatron torch_dist checkpoint: its
// metadata.json names the torch_dist sharded backend. (KempnerForge also
// writes a metadata.json beside DCP files, but without sharded_backend.)
func Detect(dir string) bool {
	c, err := ReadConfig(dir)
	return err == nil && c.ShardedBackend == "torch_dist"
}

// Open opens the checkpoint in dir: the DCP reader with Format
// ckpt.FormatMegatron. Keys stay as stored.
func Open(dir string) (*ckpt.Checkpoint, error) {
	c, err := ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	if c.ShardedBackend != "torch_dist" {
		return nil, fmt.Errorf("megatron: %s: sharded backend %q is not supported (only torch_dist)",
			filepath.Join(dir, ConfigFile), c.ShardedBackend)
	}
	return torchdcp.OpenWith(dir, torchdcp.Options{Format: ckpt.FormatMegatron})
}
