package torchdcp

import (
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/source"
)

// Open opens the DCP checkpoint in the local directory dir.
func Open(dir string) (*ckpt.Checkpoint, error) { return OpenWith(dir, Options{}) }

// OpenWith opens the DCP checkpoint in the local directory dir with options.
func OpenWith(dir string, opts Options) (*ckpt.Checkpoint, error) {
	return treetest.OpenLocal(dir, func(t source.Tree) (*ckpt.Checkpoint, error) { return OpenTree(t, opts) })
}
