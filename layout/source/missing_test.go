package source

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestIsMissing: what a local tree says about names it does not show is
// "missing"; a tree that fails is not.
func TestIsMissing(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "file"), nil, 0o644))
	require.NoError(t, os.Symlink("nowhere", filepath.Join(dir, "dangling")))
	require.NoError(t, os.Symlink("/etc", filepath.Join(dir, "out")))
	require.NoError(t, os.Symlink("loop2", filepath.Join(dir, "loop1")))
	require.NoError(t, os.Symlink("loop1", filepath.Join(dir, "loop2")))
	tree, err := OpenLocal(dir)
	require.NoError(t, err)
	defer tree.Close()
	for _, name := range []string{"absent", "file/x", "dangling", "out", "loop1", "../up"} {
		_, err := tree.Stat(name)
		require.Error(t, err, name)
		require.True(t, IsMissing(err), "%s: %v", name, err)
	}
	for _, err := range []error{
		&fs.PathError{Op: "stat", Path: "x", Err: syscall.EACCES},
		&fs.PathError{Op: "stat", Path: "x", Err: syscall.EIO},
		fmt.Errorf("s3: request failed: %w", errors.New("connection refused")),
	} {
		require.False(t, IsMissing(err), "%v", err)
	}
}
