package vfs

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"path"
	"syscall"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/hfwrite"
	"github.com/ckptfs/ckptfs/layout/source"
)

// errnos maps the sentinel errors of the layers below to what a file
// system call returns, in order: the first that matches (errors.Is) wins.
// quiet ones are answers, not problems: they are not logged.
var errnos = []struct {
	err   error
	errno syscall.Errno
	quiet bool
}{
	// The source is not what it should be, or a file could not be
	// committed (whatever the cause, a full disk included, so that close(2)
	// reports it; the log line names the cause).
	{ckpt.ErrSourceChanged, syscall.EIO, false},
	{ckpt.ErrInvalid, syscall.EIO, false},
	{hfwrite.ErrCommit, syscall.EIO, false},
	{hfwrite.ErrDone, syscall.EIO, false},
	// The rules of a write session.
	{hfwrite.ErrReserved, syscall.EPERM, true},
	{hfwrite.ErrCommitted, syscall.EPERM, true},
	{hfwrite.ErrBusy, syscall.EBUSY, true},
	{hfwrite.ErrReadOnly, syscall.EROFS, true},
	{hfwrite.ErrStale, syscall.ESTALE, true},
	{syscall.ENAMETOOLONG, syscall.ENAMETOOLONG, true},
	// The request was interrupted.
	{context.Canceled, syscall.EINTR, true},
	{context.DeadlineExceeded, syscall.EINTR, true},
	// The standard library's.
	{fs.ErrNotExist, syscall.ENOENT, true},
	{fs.ErrExist, syscall.EEXIST, true},
	{fs.ErrPermission, syscall.EACCES, true},
}

// toErrno is the one place Go errors become errnos (errnos above): an
// errno passes through (ENOSPC from a write, logged), an unexpected error
// is EIO. Every error but the quiet ones gets one log line naming what was
// being done (the layout errors already name the view file, offset, tensor
// and source file).
func toErrno(log *slog.Logger, what string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	errno, quiet := mapErr(err)
	if !quiet {
		log.Error(what, "errno", errno.Error(), "err", err)
	}
	return errno
}

func mapErr(err error) (errno syscall.Errno, quiet bool) {
	for _, m := range errnos {
		if errors.Is(err, m.err) {
			return m.errno, m.quiet
		}
	}
	if errors.As(err, &errno) && errno != 0 {
		return errno, false
	}
	return syscall.EIO, false
}

// sourceErrno maps the error of a stat or listing of the source name (the
// lookups, attributes and listings of the tree) to what the caller gets. A
// name the source does not show is ENOENT, an answer. Anything else is the
// source failing (a store that does not answer, refuses the credentials or
// times out; a local EIO), which must not read as "no such file": EIO, or
// EACCES for a local permission error, counted in Stats.LookupErrors, with
// one log line naming the source path and the cause, at most one per
// directory and window with a count of the others (errorLog); a remote
// source's outage gets one as it begins and one as it ends (outageTree).
func (f *FS) sourceErrno(op, name string, err error) syscall.Errno {
	switch {
	case err == nil:
		return 0
	case source.IsMissing(err):
		return syscall.ENOENT
	case errors.Is(err, context.Canceled):
		return syscall.EINTR // the mount is closing: its requests were ended
	}
	errno := syscall.EIO
	if errors.Is(err, fs.ErrPermission) {
		errno = syscall.EACCES
	}
	f.lookupErrors.Add(1)
	if !inOutage(err) { // else the outage is logged as it begins and ends (outageTree)
		// Repeated at will by anyone who can stat the name: rate-limited
		// per directory (errorLog).
		f.errLog.Error(f.tree.Path(path.Dir(name)), op+" "+f.tree.Path(name), err, "errno", errno.Error())
	}
	return errno
}

// discard takes the log lines of errors that were logged before.
var discard = slog.New(slog.DiscardHandler)

// toErrnoLogged maps an error that was already logged: a commit's result,
// which the session reported and every later close of the file returns
// again.
func toErrnoLogged(err error) syscall.Errno { return toErrno(discard, "", err) }
