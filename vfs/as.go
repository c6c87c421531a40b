package vfs

// A writable mount writes as its writer: a directory or file is created
// only where the caller of the FUSE request may write in the source (the
// kernel checks that first, against the attributes attr.go shows; this is
// the server's own check of the source itself), and what is created
// belongs to the caller. A mount run by root creates, then hands over
// (source.Dir.Own); one run by another user can only create its own files,
// so it refuses any other caller.

import (
	"context"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ckptfs/ckptfs/layout/source"
)

// writer is who creates: the caller, and whether what is created must be
// handed to them (uid, gid), the mount's own user being someone else.
type writer struct {
	source.Caller
	handOver bool
	uid, gid int // the new files' owner when handOver
}

// callerOf is the caller of the FUSE request of ctx; the mount's own user
// outside of one (a test calling a node).
func callerOf(ctx context.Context) source.Caller {
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return source.Caller{Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid())}
	}
	// Without its groups (a process gone), the caller is checked as its
	// uid and gid alone: never granted more.
	groups, _ := source.CallerGroups(c.Pid)
	return source.Caller{Uid: c.Uid, Gid: c.Gid, Groups: groups}
}

// mayCreate checks that the caller of ctx may create name in d's source
// directory (write and search it), and that this mount can make it
// theirs. Anything else is EACCES with one log line.
func (d *Dir) mayCreate(ctx context.Context, op, name string) (writer, syscall.Errno) {
	c := callerOf(ctx)
	w := writer{Caller: c}
	real := filepath.Join(d.real, name)
	info, err := d.fsys.tree.Stat(d.name())
	if err != nil {
		return w, d.fsys.sourceErrno("stat", d.name(), err)
	}
	if acc := d.fsys.access(info); !acc.Allows(c, source.MayWrite|source.MayExec) {
		d.fsys.log.Warn("refused: the caller may not write in the source directory", "op", op, "path", real,
			"uid", c.Uid, "gid", c.Gid, "dir", acc.String())
		return w, syscall.EACCES
	}
	euid := uint32(os.Geteuid())
	switch {
	case c.Uid == euid:
		return w, 0
	case euid != 0:
		d.fsys.log.Warn("refused: a mount not run by root creates files for its own user only", "op", op, "path", real,
			"uid", c.Uid, "mount_uid", euid)
		return w, syscall.EACCES
	}
	w.handOver, w.uid, w.gid = true, int(c.Uid), int(c.Gid)
	// A set-group-ID directory hands its group down, as the kernel does.
	if fi, err := os.Stat(d.real); err == nil && fi.Mode()&os.ModeSetgid != 0 {
		w.gid = int(info.Access.Gid)
	}
	return w, 0
}

// owner is the uid and gid what w creates belongs to.
func (w writer) owner() (uint32, uint32) {
	if w.handOver {
		return uint32(w.uid), uint32(w.gid)
	}
	return uint32(os.Geteuid()), uint32(os.Getegid())
}
