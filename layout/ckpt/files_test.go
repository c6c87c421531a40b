package ckpt

import (
	"errors"
	"io"
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

// A batch of reads, and a batch of ranges, is checked once at its end: a
// rewrite in place while it runs fails the whole batch, and a read past
// the size seen at open is refused as ReadAt refuses it.
func TestBatchesCheckAtTheEnd(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "shard")
	require.NoError(t, os.WriteFile(p, []byte("0123456789"), 0o644))
	f, err := fileSet(t, dir).Get("shard")
	require.NoError(t, err)
	a, b := make([]byte, 2), make([]byte, 3)
	_, err = f.ReadRanges([]Range{{Off: 1, Parts: [][]byte{a, b}}})
	require.NoError(t, err)
	assert.Equal(t, "12345", string(a)+string(b))
	require.NoError(t, f.Batch(func(r io.ReaderAt) error {
		_, err := r.ReadAt(a, 8)
		return err
	}))
	assert.Equal(t, "89", string(a))
	assert.ErrorIs(t, f.Batch(func(r io.ReaderAt) error {
		_, err := r.ReadAt(b, 8)
		return err
	}), ErrInvalid)
	failed, err := f.ReadRanges([]Range{{Off: 0, Parts: [][]byte{a}}, {Off: 8, Parts: [][]byte{b}}})
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Equal(t, 1, failed, "the range that failed")

	err = f.Batch(func(r io.ReaderAt) error {
		if _, err := r.ReadAt(a, 0); err != nil {
			return err
		}
		return os.WriteFile(p, []byte("abcdefghij"), 0o644) // in place: same inode, same size
	})
	assert.ErrorIs(t, err, ErrSourceChanged)
	failed, err = f.ReadRanges([]Range{{Off: 0, Parts: [][]byte{a}}})
	assert.ErrorIs(t, err, ErrSourceChanged)
	assert.Equal(t, 1, failed, "the check after the batch")
}

func TestGetConfines(t *testing.T) {
	set := fileSet(t, t.TempDir())
	for _, name := range []string{"../x", "/etc/passwd", "", "a/../../x"} {
		_, err := set.Get(name)
		assert.ErrorIs(t, err, ErrInvalid, name)
	}
}

// recordingTree notes the files it was told are read out of order.
type recordingTree struct {
	source.Tree
	random *[]string
}

func (t recordingTree) Open(name string) (source.File, error) {
	f, err := t.Tree.Open(name)
	if err != nil {
		return nil, err
	}
	return &recordingFile{File: f, name: name, random: t.random}, nil
}

type recordingFile struct {
	source.File
	name   string
	random *[]string
}

func (f *recordingFile) ReadRandomly() { *f.random = append(*f.random, f.name) }

// A set read out of order tells each of its files so: those open already
// at once, the others when they open, and only then.
func TestReadRandomly(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"a", "b"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("0123456789"), 0o644))
	}
	for _, random := range []bool{false, true} {
		tree, err := source.OpenLocal(dir)
		require.NoError(t, err)
		var told []string
		set := NewFileSet(recordingTree{Tree: tree, random: &told})
		set.Adopt(tree)
		a, err := set.Get("a") // a reader reads headers while opening
		require.NoError(t, err)
		_, err = a.ReadAt(make([]byte, 4), 0)
		require.NoError(t, err)
		b, err := set.Get("b")
		require.NoError(t, err)
		if random {
			set.ReadRandomly()
		}
		for _, f := range []*File{a, b} {
			_, err = f.ReadAt(make([]byte, 4), 4)
			require.NoError(t, err)
		}
		if random {
			assert.Equal(t, []string{"a", "b"}, told)
		} else {
			assert.Empty(t, told)
		}
		require.NoError(t, set.Close())
	}
}

func TestOutOfFileOrder(t *testing.T) {
	a, b := &File{Rel: "a"}, &File{Rel: "b"}
	tensor := func(secs ...*Section) *Tensor {
		t := &Tensor{}
		for _, s := range secs {
			t.Chunks.Add(nil, nil, s)
		}
		return t
	}
	inOrder := []*Tensor{
		tensor(&Section{File: a, Offset: 0, Length: 10}, &Section{File: b, Offset: 0, Length: 10}),
		tensor(&Section{File: a, Offset: 10, Length: 5}, &Section{File: b, Offset: 20, Length: 5}),
	}
	assert.False(t, OutOfFileOrder(inOrder))
	back := []*Tensor{
		tensor(&Section{File: a, Offset: 10, Length: 10}),
		tensor(&Section{File: b, Offset: 0, Length: 10}),
		tensor(&Section{File: a, Offset: 0, Length: 10}),
	}
	assert.True(t, OutOfFileOrder(back))
}

// ReadUnchecked does not check a batch that succeeds: a later Check does,
// and fails for a change made at any time before it, the next one too. A
// batch that fails is checked either way, and a change is the error it
// gives (bytes read across a change decode as garbage), with Batch too.
func TestReadUncheckedLeavesTheCheck(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "shard")
	require.NoError(t, os.WriteFile(p, []byte("0123456789"), 0o644))
	f, err := fileSet(t, dir).Get("shard")
	require.NoError(t, err)
	garbage := errors.New("garbage")
	a := make([]byte, 2)
	require.ErrorIs(t, f.ReadUnchecked(func(io.ReaderAt) error { return garbage }), garbage, "unchanged: fn's error")
	require.NoError(t, f.Check())

	require.NoError(t, f.ReadUnchecked(func(r io.ReaderAt) error {
		if _, err := r.ReadAt(a, 0); err != nil {
			return err
		}
		return os.WriteFile(p, []byte("abcdefghij"), 0o644) // in place: same inode, same size
	}), "not checked")
	assert.ErrorIs(t, f.Check(), ErrSourceChanged)
	assert.ErrorIs(t, f.Check(), ErrSourceChanged, "and every check after")
	assert.ErrorIs(t, f.ReadUnchecked(func(io.ReaderAt) error { return garbage }), ErrSourceChanged)
	assert.ErrorIs(t, f.Batch(func(io.ReaderAt) error { return garbage }), ErrSourceChanged)
}
