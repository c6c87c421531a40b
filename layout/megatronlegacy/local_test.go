package megatronlegacy

import (
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

// Open opens the checkpoint in the local directory dir.
func Open(dir string) (*ckpt.Checkpoint, error) { return treetest.OpenLocal(dir, OpenTree) }
