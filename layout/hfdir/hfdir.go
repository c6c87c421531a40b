// Package hfdir owns the HF model directory, read and written: the names
// of its weight files and their index, the index (`*.index.json`) that
// names the file of each tensor of a sharded model, and which files of a
// directory are weights, an index or sidecars (config.json, tokenizer
// files). The formats whose directories are HF's (safetensors,
// pytorch_model.bin) read it here, the view planner writes it here, and a
// write session checks what it receives here.
package hfdir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	"github.com/ckptfs/ckptfs/layout/source"
)

// The weight files of an HF directory: one file, or shards named by an
// index.
const (
	SafetensorsFile  = "model.safetensors"
	SafetensorsIndex = "model.safetensors.index.json"
	TorchFile        = "pytorch_model.bin"
	TorchIndex       = "pytorch_model.bin.index.json"
)

// MaxIndexBytes bounds an index (about 100 bytes per tensor: a 1M-tensor
// index is about 100 MB).
const MaxIndexBytes = 256 << 20

// ShardName is the name save_pretrained gives the i-th (from 0) of n
// safetensors shards.
func ShardName(i, n int) string {
	if n == 1 {
		return SafetensorsFile
	}
	return fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, n)
}

// knownSidecars are the files an HF model directory carries beside its
// weights, which a view shows: config, generation config, tokenizer and
// processor files.
var knownSidecars = []string{
	"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
	"tokenizer.model", "special_tokens_map.json", "added_tokens.json", "vocab.json",
	"vocab.txt", "merges.txt", "chat_template.jinja", "chat_template.json",
	"preprocessor_config.json", "processor_config.json", "*.tiktoken", "spiece.model",
}

// IsKnownSidecar reports whether name is one of the knownSidecars.
func IsKnownSidecar(name string) bool {
	for _, p := range knownSidecars {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// Kind is what a file of an HF directory is, by its name.
type Kind int

const (
	// Sidecar is any other file: config, tokenizer, generation config
	// (written, it is stored as it is; a view shows the known ones).
	Sidecar Kind = iota
	// Weights is a safetensors file (*.safetensors).
	Weights
	// Index is a safetensors shard index (*.safetensors.index.json).
	Index
)

// KindOf returns the kind of the file name.
func KindOf(name string) Kind {
	switch {
	case strings.HasSuffix(name, ".safetensors.index.json"):
		return Index
	case strings.HasSuffix(name, ".safetensors"):
		return Weights
	}
	return Sidecar
}

// ShardIndex is the content of an index file.
type ShardIndex struct {
	// TotalSize is the bytes of tensor data of all shards (metadata.total_size).
	TotalSize int64
	// WeightMap names the file of each tensor.
	WeightMap map[string]string
}

// Encode returns the index as save_pretrained writes it (indented JSON, a
// final newline).
func (x ShardIndex) Encode() ([]byte, error) {
	b, err := json.MarshalIndent(map[string]any{
		"metadata":   map[string]any{"total_size": x.TotalSize},
		"weight_map": x.WeightMap,
	}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// ParseIndex parses the index b; name names it in errors. An index must
// have a weight_map (it may be empty: a directory whose tensors are still
// to be written).
func ParseIndex(b []byte, name string) (ShardIndex, error) {
	if len(b) > MaxIndexBytes {
		return ShardIndex{}, fmt.Errorf("%s is %d bytes, more than %d", name, len(b), MaxIndexBytes)
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return ShardIndex{}, fmt.Errorf("%s is not a shard index: %v", name, err)
	}
	if idx.WeightMap == nil {
		return ShardIndex{}, fmt.Errorf("%s has no weight_map", name)
	}
	return ShardIndex{WeightMap: idx.WeightMap}, nil
}

// WeightFiles returns the weight files of dir, sorted, and the weight map
// of its index file (nil when there is none: the model is the one file
// single).
func WeightFiles(dir source.Tree, index, single string) ([]string, map[string]string, error) {
	b, err := source.ReadFile(dir, index, MaxIndexBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return []string{single}, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	idx, err := ParseIndex(b, dir.Path(index))
	if err != nil {
		return nil, nil, err
	}
	if len(idx.WeightMap) == 0 {
		return nil, nil, fmt.Errorf("%s: empty weight_map", dir.Path(index))
	}
	seen := map[string]bool{}
	var files []string
	for _, f := range idx.WeightMap {
		if !seen[f] {
			seen[f] = true
			files = append(files, f)
		}
	}
	sort.Strings(files)
	return files, idx.WeightMap, nil
}
