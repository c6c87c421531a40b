package megatronlegacy

import "github.com/ckptfs/ckptfs/layout/ckpt"

// Open opens the checkpoint in the local directory dir.
func Open(dir string) (*ckpt.Checkpoint, error) { return ckpt.OpenLocal(dir, OpenTree) }
