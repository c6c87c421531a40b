// Package hfdir reads what an HF model directory says about its weight
// files: the index (`*.index.json`) that names the file of each tensor of
// a sharded model, or the one weight file of an unsharded one. The formats
// whose directories are HF's (safetensors, pytorch_model.bin) read it here.
package hfdir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sort"

	"github.com/ckptfs/ckptfs/layout/source"
)

// maxIndexBytes bounds an index (about 100 bytes per tensor).
const maxIndexBytes = 64 << 20

// WeightFiles returns the weight files of dir, sorted, and the weight map
// of its index file (nil when there is none: the model is the one file
// single).
func WeightFiles(dir source.Tree, index, single string) ([]string, map[string]string, error) {
	b, err := source.ReadFile(dir, index, maxIndexBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return []string{single}, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", dir.Path(index), err)
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
