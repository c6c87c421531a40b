package ckpt

import (
	"regexp"
	"slices"

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
	// key (IsOptimizerPath) out of Tensors: they are in Left, named,
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

// optimizerKeys are keys whose subtrees are optimizer state, at any level
// of a saved nesting, as frameworks save it: {"optimizer": ...} (DCP,
// KempnerForge), "optim" (NeMo), "optimizers" (Composer's
// state.optimizers), "optimizer_states" (Lightning's .ckpt),
// "optimizer_state_dict" (the torch tutorials' dict), "opt".
var optimizerKeys = map[string]bool{"optimizer": true, "optim": true, "optimizers": true, "opt": true,
	"optimizer_states": true, "optimizer_state_dict": true}

// optimizerIndexed is Lightning's key for its N-th optimizer in a sharded
// save ({"model": ..., "optimizer_0": ...}).
var optimizerIndexed = regexp.MustCompile(`^optimizer_[0-9]+$`)

// IsOptimizerKey reports whether a subtree saved under key is optimizer
// state.
func IsOptimizerKey(key string) bool { return optimizerKeys[key] || optimizerIndexed.MatchString(key) }

// IsOptimizerPath reports whether a tensor saved at path (Tensor.Path) is
// optimizer state: nested under an optimizer key, at any level.
func IsOptimizerPath(path []string) bool {
	return slices.ContainsFunc(path[:max(len(path)-1, 0)], IsOptimizerKey)
}

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
	return LeftTensor{Name: t.Name, Path: t.Path, DType: t.DType, Shape: t.Shape, Chunks: t.Chunks.Len(),
		ShardedDims: t.ShardedDims(), Bytes: t.ByteSize()}
}
