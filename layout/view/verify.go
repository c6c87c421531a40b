package view

import (
	"sync"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// Verify makes every byte the checkpoint serves checked against the
// checksum its format stores: the first read of a chunk whose source can
// verify itself (a torch.save record's CRC32) first checks the whole
// record, and a mismatch is an error for every read of that chunk. Later
// changes to the file are caught by the freshness checks every read makes.
// Verify returns how many chunks are checked and how many have no checksum
// to check (safetensors stores none). Call it before planning a view.
func Verify(c *ckpt.Checkpoint) (verified, unverifiable int) {
	for _, t := range c.Tensors {
		for i := range t.Chunks.Len() {
			if v, ok := t.Chunks.Source(i).(ckpt.Verifier); ok {
				t.Chunks.SetSource(i, &verifying{Verifier: v})
				verified++
			} else {
				unverifiable++
			}
		}
	}
	return verified, unverifiable
}

// verifying checks its source once, before the first byte is served.
type verifying struct {
	ckpt.Verifier
	once sync.Once
	err  error
}

func (v *verifying) ReadAt(p []byte, off int64) (int, error) {
	if err := v.verified(); err != nil {
		return 0, err
	}
	return v.Verifier.ReadAt(p, off)
}

func (v *verifying) verified() error {
	v.once.Do(func() { v.err = v.Verifier.Verify() })
	return v.err
}

// Locate says where the verified source's bytes lie, once verified.
func (v *verifying) Locate() (ckpt.Location, bool, error) {
	if err := v.verified(); err != nil {
		return ckpt.Location{}, false, err
	}
	if l, ok := v.Verifier.(ckpt.Locator); ok {
		return l.Locate()
	}
	return ckpt.Location{}, false, nil
}

// Backing is the file the verified source reads, for freshness checks.
func (v *verifying) Backing() *ckpt.File {
	if b, ok := v.Verifier.(ckpt.Backed); ok {
		return b.Backing()
	}
	return nil
}
