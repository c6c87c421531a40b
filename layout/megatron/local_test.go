package megatron

import (
	"io"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/source"
)

// Open opens the checkpoint in the local directory dir.
func Open(dir string) (*ckpt.Checkpoint, error) { return treetest.OpenLocal(dir, OpenTree) }

// ReadArgs returns the scalar training arguments common.pt stores.
func ReadArgs(dir source.Tree) (map[string]any, error) {
	cs, err := readCommonFile(dir)
	return cs.args, err
}

// CommonStateArgs returns the arguments stored in c's common_state object.
func CommonStateArgs(c *ckpt.Checkpoint) (map[string]any, error) {
	cs, err := commonStateOf(c)
	return cs.args, err
}

// commonArgs is decodeCommon's args.
func commonArgs(r io.ReaderAt, size int64, inList bool) (map[string]any, error) {
	cs, err := decodeCommon(r, size, inList)
	return cs.args, err
}
