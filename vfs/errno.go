package vfs

import (
	"errors"
	"log/slog"
	"os"
	"syscall"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// toErrno is the one place Go errors become errnos. Errors that mean "the
// source is not what it should be" are EIO; an unexpected error is EIO too,
// with one log line naming what was being done (the layout errors already
// name the view file, offset, tensor and source file).
func toErrno(log *slog.Logger, what string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	switch {
	case errors.Is(err, ckpt.ErrSourceChanged), errors.Is(err, ckpt.ErrInvalid):
		errno = syscall.EIO
	case errors.Is(err, os.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, os.ErrPermission):
		return syscall.EACCES
	case errors.As(err, &errno):
		if errno == syscall.ENOENT {
			return errno
		}
	default:
		errno = syscall.EIO
	}
	log.Error(what, "errno", errno.Error(), "err", err)
	return errno
}
