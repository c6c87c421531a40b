package ckpt

import (
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/safetensors"
)

// Optimizer state is what no view shows as weights unless asked for it by
// name, and it is most of a training checkpoint's index (Adam keeps two
// tensors per parameter): a format whose index tells it apart by its saved
// nesting can leave it out of Tensors when the caller says it will not
// show it, so that it costs no memory while the checkpoint is open.

// OpenOptions say what a caller will use of a checkpoint.
type OpenOptions struct {
	// LeaveOptimizer lets a format leave tensors saved under an optimizer
	// root (IsOptimizerPath) out of Tensors: they are in Left, named,
	// described and checked like the others, their chunks not kept.
	LeaveOptimizer bool
}

// ReaderWith is a Reader that can take OpenOptions.
type ReaderWith interface {
	Reader
	OpenWith(dir source.Tree, o OpenOptions) (*Checkpoint, error)
}

// OpenWith opens dir as r does, with o when r takes options.
func OpenWith(r Reader, dir source.Tree, o OpenOptions) (*Checkpoint, error) {
	if rw, ok := r.(ReaderWith); ok {
		return rw.OpenWith(dir, o)
	}
	return r.Open(dir)
}

// optimizerRoots are top-level keys whose subtrees are optimizer state.
var optimizerRoots = map[string]bool{"optimizer": true, "optim": true, "optimizers": true, "opt": true}

// IsOptimizerPath reports whether a tensor saved at path (Tensor.Path) is
// optimizer state: nested under an optimizer root.
func IsOptimizerPath(path []string) bool {
	return len(path) >= 2 && optimizerRoots[path[0]]
}

// IsOptimizerRoot reports whether key is a top-level key of optimizer state.
func IsOptimizerRoot(key string) bool { return optimizerRoots[key] }

// LeftTensor describes a tensor of Left: what inspect shows of a tensor.
type LeftTensor struct {
	Name        string
	Path        []string
	DType       safetensors.DType
	Shape       []int64
	Chunks      int
	ShardedDims []int
	Bytes       int64
}

// Leave describes t for Left.
func Leave(t *Tensor) LeftTensor {
	return LeftTensor{Name: t.Name, Path: t.Path, DType: t.DType, Shape: t.Shape, Chunks: len(t.Chunks),
		ShardedDims: t.ShardedDims(), Bytes: t.ByteSize()}
}
