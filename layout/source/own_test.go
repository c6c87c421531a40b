package source

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
)

// TestDirOwn: what a Dir with an owner creates (directories, temporary
// directories, files, in its Subs too) belongs to that owner; a link
// swapped in for a directory just made is not followed.
func TestDirOwn(t *testing.T) {
	testenv.RequireSystem(t, os.Geteuid() == 0, "root (chown)")
	top := t.TempDir()
	d, err := OpenDir(top)
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, d.Mkdir("mine", 0o755)) // before Own: the mounter's
	d.Own(4242, 4243)
	require.NoError(t, d.Mkdir("a", 0o755))
	tmp, err := d.MkdirTemp("t-", 0o700)
	require.NoError(t, err)
	f, err := d.Create("a/f", 0o644)
	require.NoError(t, err)
	f.Close()
	f, err = d.OpenFile("g", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	require.NoError(t, err)
	f.Close()
	sub, err := d.Sub("a")
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, sub.Mkdir("b", 0o755))
	f, err = sub.Create("b/h", 0o644)
	require.NoError(t, err)
	f.Close()
	owner := func(name string) [2]uint32 {
		var st syscall.Stat_t
		require.NoError(t, syscall.Lstat(filepath.Join(top, name), &st), name)
		return [2]uint32{st.Uid, st.Gid}
	}
	for _, name := range []string{"a", tmp, "a/f", "g", "a/b", "a/b/h"} {
		require.Equal(t, [2]uint32{4242, 4243}, owner(name), name)
	}
	require.Equal(t, [2]uint32{0, 0}, owner("mine"))
	// A link where the directory was: refused, its target untouched.
	require.NoError(t, os.Symlink("mine", filepath.Join(top, "l")))
	require.Error(t, d.chownDir("l"))
	require.Equal(t, [2]uint32{0, 0}, owner("mine"))
}
