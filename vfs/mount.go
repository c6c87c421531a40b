package vfs

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// maxBackground is the mount's FUSE max_background.
const maxBackground = 64

// DefaultReadAhead is the read-ahead of a mount whose source is not on a
// block device (tmpfs, an object store), in bytes: as far as a disk's own
// read-ahead commonly goes (BENCHMARKS.md, run Q).
const DefaultReadAhead = 8 << 20

// SourceReadAhead is the read-ahead (read_ahead_kb, in bytes) of the block
// device that holds dir, false when dir is on none (tmpfs, overlay, NFS,
// FUSE: those keep DefaultReadAhead).
// A mount that reads ahead as far faults a view in the windows a copy on
// that disk is faulted in: a load that touches only part of a file reads
// no more through the mount than from the copy (BENCHMARKS.md, run T).
func SourceReadAhead(dir string) (int64, bool) {
	var st unix.Stat_t
	if unix.Stat(dir, &st) != nil {
		return 0, false
	}
	return blockReadAhead("/sys", unix.Major(st.Dev), unix.Minor(st.Dev))
}

// blockReadAhead reads the read_ahead_kb of block device major:minor under
// sysfs: its own queue's, or its disk's for a partition.
func blockReadAhead(sysfs string, major, minor uint32) (int64, bool) {
	// A link to the device's directory, a partition's inside its disk's.
	dev, err := filepath.EvalSymlinks(filepath.Join(sysfs, "dev", "block", fmt.Sprintf("%d:%d", major, minor)))
	if err != nil {
		return 0, false
	}
	queue := filepath.Join(dev, "queue")
	if _, err := os.Stat(filepath.Join(dev, "partition")); err == nil {
		queue = filepath.Join(filepath.Dir(dev), "queue")
	}
	b, err := os.ReadFile(filepath.Join(queue, "read_ahead_kb"))
	if err != nil {
		return 0, false
	}
	kb, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 32)
	if err != nil || kb < 0 {
		return 0, false
	}
	return kb << 10, true
}

// MountOptions are the kernel-facing settings of a mount.
type MountOptions struct {
	// ReadAheadKB, when > 0, is written to the mount's
	// /sys/class/bdi/<dev>/read_ahead_kb (root only): it lets the kernel send
	// reads larger than 128 KiB and read ahead further.
	ReadAheadKB int
	// AllowOther lets users other than the mounter see the files.
	AllowOther bool
	// Debug logs every FUSE request, as debug records of the FS's logger.
	Debug bool
	// Options are standard mount options for the kernel, as fstab and
	// mount -o give them: ro, dev/nodev, suid/nosuid, exec/noexec,
	// default_permissions.
	Options []string
	// FsName is the mount's source in mountinfo: the source as the user
	// wrote it (an fstab line's first field), so that mount -a finds the
	// fstab line mounted and does not mount it again. Default: the source's
	// path.
	FsName string
	// AsyncDIO negotiates FUSE_ASYNC_DIO: an O_DIRECT read or write is sent
	// as all its requests at once, not each after the reply to the last
	// (Run:ai Model Streamer reads with io_uring and O_DIRECT). Off by
	// default: the kernel then waits for them uninterruptibly and sends no
	// INTERRUPT, so such a reader of a stalled store gets no EINTR.
	AsyncDIO bool
	// ObserveOp, if set, is told of every FUSE request of the ops in
	// observedFS: its name (lookup, getattr, open, read, ...), how long it
	// took, and its errno (0 for success).
	ObserveOp func(op string, took time.Duration, errno syscall.Errno)
}

// Mount mounts the tree of fsys at mnt and returns the running server.
// The caller calls server.Wait, and server.Unmount on shutdown.
func Mount(mnt string, fsys *FS, mo MountOptions) (*fuse.Server, error) {
	fsName := mo.FsName
	if fsName == "" {
		fsName = fsys.root
	}
	// With Debug, nearly all go-fuse says is request traces; without, it
	// only speaks of problems.
	fuseLog := StdLogger(fsys.log, slog.LevelWarn)
	if mo.Debug {
		fuseLog = StdLogger(fsys.log, slog.LevelDebug)
	}
	// open(O_TRUNC) arrives as one OPEN with O_TRUNC, not OPEN then a
	// SETATTR without the handle (the write path).
	caps := uint64(fuse.CAP_ATOMIC_O_TRUNC)
	if mo.AsyncDIO {
		caps |= fuse.CAP_ASYNC_DIO
	}
	timeout := fsys.opts.ViewTimeout
	negative := time.Second
	opts := &fs.Options{
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: &negative,
		MountOptions: fuse.MountOptions{
			FsName:       fsName, // the type, fuse.ckptfs, says what it is
			Name:         "ckptfs",
			MaxWrite:     1 << 20,
			MaxReadAhead: 1 << 20,
			// The kernel's read-ahead of a view is sent as background requests,
			// at most this many at once: go-fuse's 12 stalls a read-ahead
			// window past 12 MiB (BENCHMARKS.md, run Q).
			MaxBackground: maxBackground,
			DirectMount:   true,
			AllowOther:    mo.AllowOther,
			Debug:         mo.Debug,
			Logger:        fuseLog,
			Options:       withDefaultPermissions(mo.Options),
			// Views are immutable; the kernel may cache everything it reads.
			ExplicitDataCacheControl: false,
			ExtraCapabilities:        caps,
			// Every read reply is bytes in memory (ReadResultData), never a
			// file descriptor, so splicing gains nothing: go-fuse would still
			// write each reply's header into a pipe and drain it again (two
			// wasted syscalls per read) before writing it normally, and a
			// 1 MiB reply plus its header does not fit the 1 MiB pipe, which
			// it logged as "trySplice: splice: want N bytes" on every one.
			DisableSplice: true,
		},
		Logger: fuseLog,
		// A mode of 0000 (a view no one but root may read) is shown as it
		// is, not replaced by 0644.
		NullPermissions: true,
		UID:             uint32(os.Getuid()),
		GID:             uint32(os.Getgid()),
	}
	if slices.Contains(mo.Options, "ro") {
		// A read-only mount, not only a read-only superblock: mountinfo's
		// mount options say ro too.
		opts.MountOptions.DirectMountFlags = syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_RDONLY
	}
	if abs, err := filepath.Abs(mnt); err == nil {
		fsys.mountpoint = abs
	}
	// fs.Mount, with the raw filesystem observed in between.
	var raw fuse.RawFileSystem = fs.NewNodeFS(fsys.Root(), opts)
	if mo.ObserveOp != nil {
		raw = &observedFS{RawFileSystem: raw, observe: mo.ObserveOp}
	}
	server, err := fuse.NewServer(raw, mnt, &opts.MountOptions)
	if err == nil {
		go server.Serve()
		err = server.WaitMount()
	}
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", mnt, err)
	}
	if mo.ReadAheadKB > 0 {
		if err := setReadAhead(mnt, mo.ReadAheadKB); err != nil {
			fsys.log.Debug("read_ahead_kb not raised", "err", err)
		}
	}
	return server, nil
}

// setReadAhead writes the backing device info's read_ahead_kb of the mount.
func setReadAhead(mnt string, kb int) error {
	path, err := bdiReadAhead(mnt)
	if err != nil {
		return err
	}
	return os.WriteFile(path, []byte(strconv.Itoa(kb)), 0o644)
}

// bdiReadAhead is the sysfs knob of the mount's anonymous device.
func bdiReadAhead(mnt string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev)), nil
}

// StdLogger returns a *log.Logger whose every line is a record of l at
// level: go-fuse logs through one (log.Default unless told otherwise),
// which would bypass the mount's --log-format and --log-file.
func StdLogger(l *slog.Logger, level slog.Level) *log.Logger {
	return log.New(slogWriter{l, level}, "", 0)
}

type slogWriter struct {
	l     *slog.Logger
	level slog.Level
}

// Write is one line of a log.Logger (it calls Write once per message).
func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Log(context.Background(), w.level, strings.TrimSuffix(string(p), "\n"), "from", "go-fuse")
	return len(p), nil
}

// observedFS times the requests of the FUSE ops that serve reads, for
// metrics; the others pass through untimed.
type observedFS struct {
	fuse.RawFileSystem
	observe func(op string, took time.Duration, errno syscall.Errno)
}

// done records a request of op begun at start whose status is *st (nil:
// none, as Release).
func (o *observedFS) done(op string, start time.Time, st *fuse.Status) {
	errno := syscall.Errno(0)
	if st != nil {
		errno = syscall.Errno(*st)
	}
	o.observe(op, time.Since(start), errno)
}

func (o *observedFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	start := time.Now()
	st := o.RawFileSystem.Lookup(cancel, h, name, out)
	counted := st
	if st == fuse.OK && out.NodeId == 0 {
		// A negative entry (cached for NegativeTimeout) is how a missing
		// name is answered: count it as the ENOENT it is.
		counted = fuse.ENOENT
	}
	o.done("lookup", start, &counted)
	return st
}

func (o *observedFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) (st fuse.Status) {
	defer o.done("getattr", time.Now(), &st)
	return o.RawFileSystem.GetAttr(cancel, in, out)
}

func (o *observedFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) (st fuse.Status) {
	defer o.done("open", time.Now(), &st)
	return o.RawFileSystem.Open(cancel, in, out)
}

func (o *observedFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (_ fuse.ReadResult, st fuse.Status) {
	defer o.done("read", time.Now(), &st)
	return o.RawFileSystem.Read(cancel, in, buf)
}

func (o *observedFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	defer o.done("release", time.Now(), nil)
	o.RawFileSystem.Release(cancel, in)
}

func (o *observedFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) (st fuse.Status) {
	defer o.done("opendir", time.Now(), &st)
	return o.RawFileSystem.OpenDir(cancel, in, out)
}

func (o *observedFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) (st fuse.Status) {
	defer o.done("readdir", time.Now(), &st)
	return o.RawFileSystem.ReadDir(cancel, in, out)
}

func (o *observedFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) (st fuse.Status) {
	defer o.done("readdirplus", time.Now(), &st)
	return o.RawFileSystem.ReadDirPlus(cancel, in, out)
}

func (o *observedFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (_ uint32, st fuse.Status) {
	defer o.done("write", time.Now(), &st)
	return o.RawFileSystem.Write(cancel, in, data)
}

func (o *observedFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) (st fuse.Status) {
	defer o.done("flush", time.Now(), &st)
	return o.RawFileSystem.Flush(cancel, in)
}

// withDefaultPermissions is the kernel options opts, with
// default_permissions always among them: the kernel checks every access
// against the owners and modes the nodes show (attr.go), with or without
// allow_other.
func withDefaultPermissions(opts []string) []string {
	if slices.Contains(opts, "default_permissions") {
		return opts
	}
	return append(slices.Clip(opts), "default_permissions")
}
