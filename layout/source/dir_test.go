package source

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDirConfined: no write operation of a Dir reaches outside it, through
// "..", an absolute name or a symlink, and its errors name the full path.
func TestDirConfined(t *testing.T) {
	top := t.TempDir()
	outside := filepath.Join(top, "outside")
	require.NoError(t, os.Mkdir(outside, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o644))
	in := filepath.Join(top, "in")
	require.NoError(t, os.Mkdir(in, 0o755))
	require.NoError(t, os.Symlink(outside, filepath.Join(in, "link")))
	require.NoError(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(in, "secretlink")))
	d, err := OpenDir(in)
	require.NoError(t, err)
	defer d.Close()

	for _, tc := range []struct {
		name string
		op   func() error
	}{
		{"create through ..", func() error { _, err := d.Create("../outside/new", 0o644); return err }},
		{"create absolute", func() error { _, err := d.Create(filepath.Join(outside, "new"), 0o644); return err }},
		{"create through a link", func() error { _, err := d.Create("link/new", 0o644); return err }},
		{"open a linked file", func() error { _, err := d.OpenFile("secretlink", os.O_WRONLY|os.O_TRUNC, 0); return err }},
		{"mkdir through a link", func() error { return d.Mkdir("link/dir", 0o755) }},
		{"rename out", func() error {
			f, err := d.Create("mine", 0o644)
			require.NoError(t, err)
			f.Close()
			return d.Rename("mine", "../outside/mine")
		}},
		{"rename in", func() error { return d.Rename("../outside/secret", "stolen") }},
		{"remove through a link", func() error { return d.Remove("link/secret") }},
		{"remove all through ..", func() error { return d.RemoveAll("../outside") }},
		{"sub through a link", func() error { _, err := d.Sub("link"); return err }},
		{"lock through a link", func() error { _, err := d.TryLock("link/secret"); return err }},
		{"chmod through ..", func() error { return d.Chmod("../outside/secret", 0o777) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			require.Error(t, err)
			assert.Contains(t, err.Error(), top, "names the full path")
		})
	}
	ents, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Len(t, ents, 1, "nothing was created outside")
	b, err := os.ReadFile(filepath.Join(outside, "secret"))
	require.NoError(t, err)
	assert.Equal(t, "s", string(b))
	fi, err := os.Stat(filepath.Join(outside, "secret"))
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o644), fi.Mode().Perm())
}

func TestDirOperations(t *testing.T) {
	d, err := OpenDir(t.TempDir())
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, d.Mkdir("a", 0o755))
	f, err := d.Create("a/f", 0o644)
	require.NoError(t, err)
	_, err = f.WriteString("x")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	_, err = d.Create("a/f", 0o644)
	require.ErrorIs(t, err, fs.ErrExist, "Create is exclusive")
	require.NoError(t, d.Rename("a/f", "a/g"))
	require.NoError(t, d.Sync("a"))
	mtime := time.Unix(1_700_000_000, 0)
	require.NoError(t, d.Chtimes("a/g", mtime, mtime))
	fi, err := d.Lstat("a/g")
	require.NoError(t, err)
	assert.True(t, fi.ModTime().Equal(mtime))
	sub, err := d.Sub("a")
	require.NoError(t, err)
	defer sub.Close()
	assert.Equal(t, d.Path("a/g"), sub.Path("g"))
	ents, err := sub.ReadDir(".")
	require.NoError(t, err)
	require.Len(t, ents, 1)
	assert.Equal(t, "g", ents[0].Name())
	tmp, err := d.MkdirTemp(".x-", 0o700)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(tmp, ".x-"))
	require.NoError(t, d.RemoveAll("a"))
	require.NoError(t, d.RemoveAll("a"), "a missing name is no error")
	_, err = d.Lstat("a")
	require.ErrorIs(t, err, fs.ErrNotExist)
	assert.Contains(t, err.Error(), d.Path("a"))
}

// TestLock: a lock held (by this process's other open, as by another
// process) refuses TryLock and SweepStale; once released, SweepStale runs.
func TestLock(t *testing.T) {
	d, err := OpenDir(t.TempDir())
	require.NoError(t, err)
	defer d.Close()
	held, err := d.CreateLocked("marker", 0o600)
	require.NoError(t, err)
	_, err = d.TryLock("marker")
	require.ErrorIs(t, err, ErrLocked)
	assert.Contains(t, err.Error(), d.Path("marker"))
	ran := false
	removed, err := d.SweepStale("marker", func() error { ran = true; return nil })
	require.NoError(t, err)
	assert.False(t, removed)
	assert.False(t, ran, "a live holder's files are left alone")

	require.NoError(t, held.Release())
	removed, err = d.SweepStale("marker", func() error { return d.Remove("marker") })
	require.NoError(t, err)
	assert.True(t, removed)
	removed, err = d.SweepStale("marker", func() error { t.Fatal("ran for a missing marker"); return nil })
	require.NoError(t, err)
	assert.False(t, removed)

	require.NoError(t, d.Mkdir("spool", 0o700))
	l, err := d.TryLock("spool")
	require.NoError(t, err, "a directory can be the lock")
	_, err = d.TryLock("spool")
	require.ErrorIs(t, err, ErrLocked)
	require.NoError(t, l.Release())
	boom := errors.New("boom")
	removed, err = d.SweepStale("spool", func() error { return boom })
	require.ErrorIs(t, err, boom)
	assert.False(t, removed)
	require.NoError(t, os.Symlink("spool", filepath.Join(d.Path("."), "spoollink")))
	_, err = d.TryLock("spoollink")
	require.ErrorIs(t, err, syscall.ELOOP, "a symlink is not a lock")
}
