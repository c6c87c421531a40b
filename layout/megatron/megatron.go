// Package megatron reads Megatron-Core dist_checkpointing checkpoints saved
// with the torch_dist backend: a DCP checkpoint (.metadata + *.distcp, keys
// are the ShardedTensor keys as stored) plus a metadata.json naming the
// backend. The .metadata root may be Megatron's MCoreMetadata; torchdcp
// decodes it as Metadata. The trainer's args come from common.pt (mcore ≤
// 0.16) or from the common_state object inside the DCP files (0.17+), or,
// for Megatron-Bridge, which records none there, from the model section of
// run_config.yaml (runconfig.go).
package megatron

import (
	"fmt"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
)

// ConfigFile is Megatron's checkpoint config (CheckpointingConfig as JSON).
const ConfigFile = "metadata.json"

// CommonFile is the non-sharded state of Megatron-Core up to 0.16 (later
// versions save it as the object CommonStateKey).
const CommonFile = "common.pt"

// maxConfigBytes bounds metadata.json; the real one is ~150 bytes.
const maxConfigBytes = 1 << 20

// Config is the part of metadata.json ckptfs reads.
type Config struct {
	ShardedBackend string `json:"sharded_backend"`
}

// ReadConfig reads dir/metadata.json.
func ReadConfig(dir source.Tree) (Config, error) {
	var c Config
	b, err := source.ReadFile(dir, ConfigFile, maxConfigBytes)
	if err != nil {
		return c, fmt.Errorf("megatron: %w", err)
	}
	if c, err = parseConfig(b); err != nil {
		return c, fmt.Errorf("megatron: %s: %w", dir.Path(ConfigFile), err)
	}
	return c, nil
}

// Reader is the Megatron-Core torch_dist format.
var Reader ckpt.Reader = reader{}

type reader struct{}

func (reader) Format() ckpt.Format { return ckpt.FormatMegatron }

// Detect reports whether dir is a Megatron torch_dist checkpoint: a DCP
// .metadata beside a metadata.json that names a sharded backend.
// (KempnerForge also writes a metadata.json beside DCP files, but without
// sharded_backend.)
func (reader) Detect(dir source.Tree) bool {
	if !torchdcp.Detect(dir) {
		return false
	}
	c, err := ReadConfig(dir)
	return err == nil && c.ShardedBackend != ""
}

func (reader) Open(dir source.Tree) (*ckpt.Checkpoint, error) { return OpenTree(dir) }

// Internal: the DCP files, the pickled common state, and Megatron's own
// metadata.json (not an HF file: a view shows only HF files).
func (reader) Internal(name string) bool {
	return torchdcp.IsInternal(name) || name == CommonFile || name == ConfigFile
}

// OpenTree opens the checkpoint in the directory tree dir: the DCP reader
// with Format ckpt.FormatMegatron. Keys stay as stored. Megatron writes
// optimizer state under "optimizer." keys (dist_checkpointing/optimizer.py);
// that nesting is recorded in each tensor's Path, so views leave it out.
func OpenTree(dir source.Tree) (*ckpt.Checkpoint, error) {
	c, err := ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	if c.ShardedBackend != "torch_dist" {
		return nil, fmt.Errorf("megatron: %s: sharded backend %q is not supported (only torch_dist)",
			dir.Path(ConfigFile), c.ShardedBackend)
	}
	ck, err := torchdcp.OpenTree(dir, torchdcp.Options{Format: ckpt.FormatMegatron})
	if err != nil {
		return nil, err
	}
	for _, t := range ck.Tensors {
		if rest, ok := strings.CutPrefix(t.Name, optimizerPrefix); ok && len(t.Path) <= 1 {
			t.Path = []string{"optimizer", rest}
		}
	}
	cs, err := readCommon(dir, ck)
	if err != nil {
		ck.Warnings = append(ck.Warnings, err.Error())
	}
	if cs.args != nil {
		ck.Record = cs.args
	} else if rc, ok, err := readRunConfig(dir); err != nil {
		ck.Warnings = append(ck.Warnings, err.Error())
	} else if ok {
		ck.Record = rc
	}
	if ck.Record == nil {
		if note := nemo2Note(ck); note != "" {
			ck.Warnings = append(ck.Warnings, note)
		}
	}
	if t := source.ModTime(dir, ConfigFile); t.After(ck.ModTime) {
		ck.ModTime = t
	}
	if cs.singleton {
		if err := stackSingletons(ck); err != nil {
			ck.Close()
			return nil, err
		}
	}
	return ck, nil
}

// optimizerPrefix starts every optimizer-state key Megatron-Core saves
// (optimizer.state.<exp_avg|exp_avg_sq|fp32_param>.<param key>).
const optimizerPrefix = "optimizer."
