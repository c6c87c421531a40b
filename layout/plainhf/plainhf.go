// Package plainhf reads plain HuggingFace model directories: one
// model.safetensors, or model-0000N-of-0000M.safetensors files named by a
// model.safetensors.index.json (what save_pretrained, torch's consolidation
// and many trainers write). Such a directory already is its own view; the
// reader still parses every header with the strict safetensors reader and
// checks the index against the files, so a damaged one is an error naming
// the file, and inspect/export work on it like on any checkpoint.
package plainhf

import (
	"fmt"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/hfdir"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/safetensors"
)

const (
	// SingleFile is the weights file of an unsharded model.
	SingleFile = hfdir.SafetensorsFile
	// IndexFile names the file of each tensor of a sharded model.
	IndexFile = hfdir.SafetensorsIndex
)

// Reader is the plain HF safetensors format.
var Reader ckpt.Reader = reader{}

type reader struct{}

func (reader) Format() ckpt.Format { return ckpt.FormatPlainHF }

// Detect reports whether dir has an index or a model.safetensors.
func (reader) Detect(dir source.Tree) bool {
	return source.Exists(dir, IndexFile) || source.Exists(dir, SingleFile)
}

func (reader) Open(dir source.Tree) (*ckpt.Checkpoint, error) { return OpenTree(dir) }

// Internal: nothing; the directory's own files are its view.
func (reader) Internal(string) bool { return false }

// index is the part of model.safetensors.index.json that is read.
// OpenTree opens the model in the directory tree dir.
func OpenTree(dir source.Tree) (*ckpt.Checkpoint, error) {
	c := &ckpt.Checkpoint{Dir: dir.Path("."), Format: ckpt.FormatPlainHF, Files: ckpt.NewFileSet(dir)}
	files, weightMap, err := listFiles(dir)
	if err == nil {
		err = addFiles(c, files, weightMap)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// listFiles returns the weight files of dir in index order, and the index's
// weight map (nil for a single file).
func listFiles(dir source.Tree) ([]string, map[string]string, error) {
	files, weightMap, err := hfdir.WeightFiles(dir, IndexFile, SingleFile)
	if err != nil {
		return nil, nil, fmt.Errorf("plainhf: %w", err)
	}
	return files, weightMap, nil
}

// addFiles reads each file's header into c: one chunk per tensor. With an
// index, each tensor must be in the file the index names, and each file's
// tensors must all be indexed.
func addFiles(c *ckpt.Checkpoint, files []string, weightMap map[string]string) error {
	c.FileIndex = map[string]int{}
	for i, name := range files {
		f, err := c.Files.Get(name)
		if err != nil {
			return fmt.Errorf("plainhf: %w", err)
		}
		h, err := safetensors.ReadHeader(f, f.Size())
		if err != nil {
			return fmt.Errorf("plainhf: %s: %w", f.Path, err)
		}
		for _, info := range h.Tensors {
			if weightMap != nil && weightMap[info.Name] != name {
				return fmt.Errorf("%w: plainhf: %s: tensor %q is not indexed to this file by %s",
					ckpt.ErrInvalid, f.Path, info.Name, IndexFile)
			}
			if _, dup := c.FileIndex[info.Name]; dup {
				return fmt.Errorf("%w: plainhf: %s: tensor %q is also in another file", ckpt.ErrInvalid, f.Path, info.Name)
			}
			c.FileIndex[info.Name] = i + 1
			c.Tensors = append(c.Tensors, &ckpt.Tensor{
				Name: info.Name, DType: info.DType, Shape: info.Shape,
				Chunks: ckpt.MakeChunks(ckpt.Chunk{
					Offsets: make([]int64, len(info.Shape)),
					Sizes:   info.Shape,
					Source:  &ckpt.Section{File: f, Offset: h.DataStart + info.Begin, Length: info.End - info.Begin},
				}),
			})
		}
		c.Passthrough = append(c.Passthrough, name)
	}
	for name, file := range weightMap {
		if _, ok := c.FileIndex[name]; !ok {
			return fmt.Errorf("%w: plainhf: %s says tensor %q is in %s, which does not hold it",
				ckpt.ErrInvalid, c.Files.Tree().Path(IndexFile), name, file)
		}
	}
	if weightMap != nil {
		c.Passthrough = append(c.Passthrough, IndexFile)
	}
	return nil
}
