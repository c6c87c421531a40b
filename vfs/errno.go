package vfs

import (
	"errors"
	"log/slog"
	"os"
	"syscall"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/hfwrite"
)

// toErrno is the one place Go errors become errnos. Errors that mean "the
// source is not what it should be" are EIO; an unexpected error is EIO too,
// with one log line naming what was being done (the layout errors already
// name the view file, offset, tensor and source file). A file that could not
// be committed is EIO whatever the cause (a full disk included), so that
// close(2) reports it; the log line names the cause.
func toErrno(log *slog.Logger, what string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	switch {
	case errors.Is(err, ckpt.ErrSourceChanged), errors.Is(err, ckpt.ErrInvalid),
		errors.Is(err, hfwrite.ErrCommit), errors.Is(err, hfwrite.ErrDone):
		errno = syscall.EIO
	case errors.Is(err, hfwrite.ErrReserved):
		errno = syscall.EPERM
	case errors.Is(err, os.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, os.ErrExist):
		return syscall.EEXIST
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

// discard takes the log lines of errors that were logged before.
var discard = slog.New(slog.DiscardHandler)

// toErrnoLogged maps an error that was already logged: a commit's result,
// which every later close of the file returns again.
func toErrnoLogged(err error) syscall.Errno { return toErrno(discard, "", err) }
