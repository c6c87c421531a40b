package vfs

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/hfwrite"
)

// TestToErrno: every error the layers below return maps to its errno,
// wrapped as they wrap it, and only real problems are logged.
func TestToErrno(t *testing.T) {
	commitErr := &hfwrite.CommitError{Name: "a.safetensors", Dir: "/d", Err: syscall.ENOSPC}
	for _, tc := range []struct {
		err    error
		errno  syscall.Errno
		logged bool
	}{
		{nil, 0, false},
		{fmt.Errorf("layout: view file x: %w", ckpt.ErrSourceChanged), syscall.EIO, true},
		{fmt.Errorf("torchdcp: %w", ckpt.ErrInvalid), syscall.EIO, true},
		{commitErr, syscall.EIO, true}, // not ENOSPC: close(2) says the commit failed
		{fmt.Errorf("%w: x", hfwrite.ErrDone), syscall.EIO, true},
		{fmt.Errorf("%w: .metadata", hfwrite.ErrReserved), syscall.EPERM, false},
		{fmt.Errorf("%w: model.safetensors", hfwrite.ErrCommitted), syscall.EPERM, false},
		{fmt.Errorf("%w: a.safetensors", hfwrite.ErrBusy), syscall.EBUSY, false},
		{fmt.Errorf("%w: config.json", hfwrite.ErrReadOnly), syscall.EROFS, false},
		{hfwrite.ErrStale, syscall.ESTALE, false},
		{context.Canceled, syscall.EINTR, false},
		{fmt.Errorf("reading: %w", context.Canceled), syscall.EINTR, false},
		{&fs.PathError{Op: "open", Path: "x", Err: syscall.ENOENT}, syscall.ENOENT, false},
		{fmt.Errorf("hfwrite: x: %w", fs.ErrNotExist), syscall.ENOENT, false},
		{&os.LinkError{Op: "rename", Old: "a", New: "b", Err: syscall.EEXIST}, syscall.EEXIST, false},
		{fs.ErrPermission, syscall.EACCES, false},
		{&fs.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}, syscall.ENOSPC, true},
		{fmt.Errorf("something else"), syscall.EIO, true},
	} {
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		assert.Equal(t, tc.errno, toErrno(log, "doing", tc.err), "%v", tc.err)
		assert.Equal(t, tc.logged, logs.Len() > 0, "%v logged: %s", tc.err, logs.String())
		assert.Equal(t, tc.errno, toErrnoLogged(tc.err), "%v", tc.err)
	}
}
