package ckpt

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
)

func fileSet(t *testing.T, dir string) *FileSet {
	t.Helper()
	tree, err := source.OpenLocal(dir)
	require.NoError(t, err)
	s := NewFileSet(tree)
	s.Adopt(tree)
	t.Cleanup(func() { s.Close() })
	return s
}

// Freshness: a file rewritten in place, replaced or removed after the
// checkpoint was opened gives ErrSourceChanged, before or after its first
// read (unlinking the old inode changes its ctime), and CheckFresh, run at
// each open of a view file, reports it.
func TestFileFreshness(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "shard")
	require.NoError(t, os.WriteFile(p, []byte("0123456789"), 0o644))
	set := fileSet(t, dir)
	f, err := set.Get("shard")
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = f.ReadAt(buf, 0)
	require.NoError(t, err)
	require.NoError(t, f.CheckFresh())

	// replaced by rename after the first read
	require.NoError(t, os.WriteFile(p+".new", []byte("abcdefghij"), 0o644))
	require.NoError(t, os.Rename(p+".new", p))
	_, err = f.ReadAt(buf, 2)
	assert.ErrorIs(t, err, ErrSourceChanged)
	assert.ErrorIs(t, f.CheckFresh(), ErrSourceChanged)

	// a second file, replaced before its first read
	q := filepath.Join(dir, "other")
	require.NoError(t, os.WriteFile(q, []byte("0123456789"), 0o644))
	g, err := set.Get("other")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(q+".new", []byte("abcdefghij"), 0o644))
	require.NoError(t, os.Rename(q+".new", q))
	_, err = g.ReadAt(buf, 0)
	assert.ErrorIs(t, err, ErrSourceChanged)

	// rewritten in place after the first read
	r := filepath.Join(dir, "third")
	require.NoError(t, os.WriteFile(r, []byte("0123456789"), 0o644))
	h, err := set.Get("third")
	require.NoError(t, err)
	_, err = h.ReadAt(buf, 0)
	require.NoError(t, err)
	fd, err := os.OpenFile(r, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = fd.WriteAt([]byte("X"), 5)
	require.NoError(t, err)
	require.NoError(t, fd.Close())
	_, err = h.ReadAt(buf, 4)
	assert.ErrorIs(t, err, ErrSourceChanged)
}

func TestGetConfines(t *testing.T) {
	set := fileSet(t, t.TempDir())
	for _, name := range []string{"../x", "/etc/passwd", "", "a/../../x"} {
		_, err := set.Get(name)
		assert.ErrorIs(t, err, ErrInvalid, name)
	}
}
