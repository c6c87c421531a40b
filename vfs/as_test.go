package vfs

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
	"github.com/ckptfs/ckptfs/layout/dcpwrite"
)

// TestMayCreate: the server's own check of a create in a writable mount,
// past the kernel's: the caller must be let write and search the source
// directory, by owner, group (supplementary ones included) or other; what
// it creates is handed to it, with the directory's group where that is
// set-group-ID. A refusal is EACCES and one log line.
func TestMayCreate(t *testing.T) {
	testenv.RequireSystem(t, os.Geteuid() == 0, "root (chown)")
	src := t.TempDir()
	for _, d := range []struct {
		name     string
		mode     os.FileMode
		uid, gid int
	}{
		{"roots", 0o755, 0, 0},
		{"shared", 0o777, 0, 0},
		{"team", 0o770, 0, 4242},
		{"opensgid", os.ModeSetgid | 0o777, 0, 4242},
		{"alices", 0o700, 4242, 4242},
	} {
		p := filepath.Join(src, d.name)
		require.NoError(t, os.Mkdir(p, 0o700))
		require.NoError(t, os.Chown(p, d.uid, d.gid))
		require.NoError(t, os.Chmod(p, d.mode))
	}
	var logs bytes.Buffer
	fsys := newFS(t, src, writable(dcpwrite.Target{}), func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	// A pid that is no process: the caller has no supplementary groups.
	const noPid = 1 << 30
	for _, c := range []struct {
		dir    string
		caller fuse.Caller
		errno  syscall.Errno
		owner  [2]uint32 // when handed over
	}{
		{"roots", fuse.Caller{Owner: fuse.Owner{Uid: 65534, Gid: 65534}, Pid: noPid}, syscall.EACCES, [2]uint32{}},
		{"roots", fuse.Caller{Owner: fuse.Owner{Uid: 0, Gid: 0}, Pid: noPid}, 0, [2]uint32{}},
		{"shared", fuse.Caller{Owner: fuse.Owner{Uid: 65534, Gid: 65534}, Pid: noPid}, 0, [2]uint32{65534, 65534}},
		{"team", fuse.Caller{Owner: fuse.Owner{Uid: 1000, Gid: 1000}, Pid: noPid}, syscall.EACCES, [2]uint32{}},
		{"team", fuse.Caller{Owner: fuse.Owner{Uid: 1000, Gid: 4242}, Pid: noPid}, 0, [2]uint32{1000, 4242}},
		{"opensgid", fuse.Caller{Owner: fuse.Owner{Uid: 1000, Gid: 1000}, Pid: noPid}, 0, [2]uint32{1000, 4242}},
		{"alices", fuse.Caller{Owner: fuse.Owner{Uid: 4242, Gid: 4242}, Pid: noPid}, 0, [2]uint32{4242, 4242}},
		{"alices", fuse.Caller{Owner: fuse.Owner{Uid: 4243, Gid: 4242}, Pid: noPid}, syscall.EACCES, [2]uint32{}},
	} {
		logs.Reset()
		d := &Dir{fsys: fsys, real: filepath.Join(src, c.dir), rel: c.dir}
		w, errno := d.mayCreate(fuse.NewContext(context.Background(), &c.caller), "mkdir", "x")
		require.Equal(t, c.errno, errno, "%s as %+v", c.dir, c.caller.Owner)
		if errno != 0 {
			require.Equal(t, 1, strings.Count(logs.String(), "\n"), logs.String())
			require.Contains(t, logs.String(), "refused")
			continue
		}
		require.Empty(t, logs.String())
		require.Equal(t, c.owner != [2]uint32{}, w.handOver, c.dir)
		if w.handOver {
			uid, gid := w.owner()
			require.Equal(t, c.owner, [2]uint32{uid, gid}, c.dir)
		}
	}
	// Supplementary groups come from the caller's process: this one's.
	groups, err := syscall.Getgroups()
	require.NoError(t, err)
	d := &Dir{fsys: fsys, real: filepath.Join(src, "team"), rel: "team"}
	require.NoError(t, syscall.Setgroups([]int{4242}))
	defer syscall.Setgroups(groups)
	caller := fuse.Caller{Owner: fuse.Owner{Uid: 1000, Gid: 1000}, Pid: uint32(os.Getpid())}
	_, errno := d.mayCreate(fuse.NewContext(context.Background(), &caller), "mkdir", "x")
	require.Equal(t, syscall.Errno(0), errno, "a member of the group by a supplementary group")
}
