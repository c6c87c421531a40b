package source

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newTree builds:
//
//	outside/secret            a file outside the tree
//	tree/a.txt                "hello"
//	tree/blobs/x              "blob"
//	tree/snap/model           -> ../blobs/x      (relative, inside)
//	tree/snap/abs             -> <tree>/blobs/x  (absolute, inside)
//	tree/snap/absdir          -> <tree>/blobs    (absolute dir, inside)
//	tree/escape               -> ../outside/secret
//	tree/absescape            -> <outside>/secret
//	tree/dirlink              -> ../outside
//	tree/dangling             -> nowhere
//	tree/fifo                 a FIFO
func newTree(t *testing.T) (*Local, string) {
	t.Helper()
	top := t.TempDir()
	out := filepath.Join(top, "outside")
	dir := filepath.Join(top, "tree")
	for _, d := range []string{out, filepath.Join(dir, "blobs"), filepath.Join(dir, "snap")} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(out, "secret"), []byte("secret"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.txt"), []byte("hello"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "blobs", "x"), []byte("blob"), 0o644))
	links := map[string]string{
		"snap/model":  "../blobs/x",
		"snap/abs":    filepath.Join(dir, "blobs", "x"),
		"snap/absdir": filepath.Join(dir, "blobs"),
		"escape":      "../outside/secret",
		"absescape":   filepath.Join(out, "secret"),
		"dirlink":     "../outside",
		"dangling":    "nowhere",
	}
	for name, target := range links {
		require.NoError(t, os.Symlink(target, filepath.Join(dir, name)))
	}
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	tree, err := OpenLocal(dir)
	require.NoError(t, err)
	t.Cleanup(func() { tree.Close() })
	return tree, dir
}

func TestLocalOpen(t *testing.T) {
	tree, _ := newTree(t)
	cases := []struct {
		name string
		want string // content, or "" when opening must fail
		err  error
	}{
		{"a.txt", "hello", nil},
		{"snap/model", "blob", nil},
		{"snap/abs", "blob", nil},
		{"snap/absdir/x", "blob", nil},
		{"snap/../a.txt", "hello", nil},
		{"escape", "", nil},
		{"absescape", "", nil},
		{"dirlink/secret", "", nil},
		{"../outside/secret", "", nil},
		{"/etc/passwd", "", nil},
		{"dangling", "", fs.ErrNotExist},
		{"missing", "", fs.ErrNotExist},
		{"fifo", "", ErrNotRegular},
		{"blobs", "", ErrNotRegular},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan struct{})
			go func() {
				defer close(done)
				f, err := tree.Open(tc.name)
				if tc.want == "" {
					require.Error(t, err)
					if tc.err != nil {
						assert.ErrorIs(t, err, tc.err)
					}
					assert.NotContains(t, err.Error(), "secret\n")
					return
				}
				require.NoError(t, err)
				defer f.Close()
				b := make([]byte, f.Info().Size)
				_, err = f.ReadAt(b, 0)
				require.NoError(t, err)
				assert.Equal(t, tc.want, string(b))
			}()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Open hung")
			}
		})
	}
}

func TestLocalErrorsNameTheFile(t *testing.T) {
	tree, dir := newTree(t)
	_, err := tree.Open("fifo")
	assert.EqualError(t, err, "source: not a regular file: "+filepath.Join(dir, "fifo")+" is a FIFO")
	_, err = tree.Open("missing")
	assert.ErrorContains(t, err, filepath.Join(dir, "missing"))
}

func TestLocalReadDirResolvesInsideLinks(t *testing.T) {
	tree, _ := newTree(t)
	ents, err := tree.ReadDir("snap")
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name)
		if e.Name == "absdir" {
			assert.True(t, e.IsDir())
		} else {
			assert.True(t, e.IsRegular(), e.Name)
			assert.EqualValues(t, 4, e.Size)
		}
	}
	assert.Equal(t, []string{"abs", "absdir", "model"}, names)

	ents, err = tree.ReadDir(".")
	require.NoError(t, err)
	names = nil
	var broken []string
	for _, e := range ents {
		names = append(names, e.Name)
		if e.IsBrokenLink() {
			broken = append(broken, e.Name)
			assert.Zero(t, e.Size)
		}
	}
	assert.Equal(t, []string{"a.txt", "absescape", "blobs", "dangling", "dirlink", "escape", "fifo", "snap"}, names)
	assert.Equal(t, []string{"absescape", "dangling", "dirlink", "escape"}, broken)
}

func TestReadFileBound(t *testing.T) {
	tree, _ := newTree(t)
	b, err := ReadFile(tree, "a.txt", 5)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(b))
	_, err = ReadFile(tree, "a.txt", 4)
	assert.ErrorIs(t, err, ErrTooLarge)
	_, err = ReadFile(tree, "fifo", 4)
	assert.ErrorIs(t, err, ErrNotRegular)
}

func TestSubStaysInBase(t *testing.T) {
	tree, _ := newTree(t)
	snap, err := Sub(tree, "snap")
	require.NoError(t, err)
	b, err := ReadFile(snap, "model", 10)
	require.NoError(t, err)
	assert.Equal(t, "blob", string(b))
	_, err = snap.Open("../a.txt")
	assert.Error(t, err, "names in a subtree are local to it")
	_, err = Sub(tree, "../outside")
	assert.Error(t, err)
	s := snap.(*sub)
	assert.Same(t, tree, s.base)
	assert.Equal(t, "snap", s.dir)
}

// An in-place rewrite of the same size with the mtime put back (rsync
// --inplace -t) is still caught through ctime.
func TestCheckCatchesInPlaceRewrite(t *testing.T) {
	tree, dir := newTree(t)
	f, err := tree.Open("a.txt")
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Check())
	p := filepath.Join(dir, "a.txt")
	fi, err := os.Stat(p)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, []byte("HELLO"), 0o644))
	require.NoError(t, os.Chtimes(p, fi.ModTime(), fi.ModTime()))
	fi2, err := os.Stat(p)
	require.NoError(t, err)
	require.Equal(t, fi.ModTime(), fi2.ModTime())
	require.Equal(t, fi.Size(), fi2.Size())
	assert.ErrorIs(t, f.Check(), ErrChanged)
	st, err := tree.Stat("a.txt")
	require.NoError(t, err)
	assert.NotEqual(t, f.Info().Version, st.Version)
}

func TestTruncatedReadIsChanged(t *testing.T) {
	tree, dir := newTree(t)
	f, err := tree.Open("a.txt")
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, os.Truncate(filepath.Join(dir, "a.txt"), 2))
	_, err = f.ReadAt(make([]byte, 5), 0)
	assert.True(t, errors.Is(err, ErrChanged), "%v", err)
}

// ReadvAt fills its parts in order, whatever their number and sizes (empty
// ones, more than one preadv takes), as ReadParts does for a file that
// reads into one buffer; a file found shorter is ErrChanged for both.
func TestReadvAtScatters(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 3000)
	for i := range data {
		data[i] = byte(i * 31)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), data, 0o644))
	tree, err := OpenLocal(dir)
	require.NoError(t, err)
	defer tree.Close()
	f, err := tree.Open("f")
	require.NoError(t, err)
	defer f.Close()
	_, ok := f.(VectoredReader)
	require.True(t, ok, "a local file reads with preadv")
	for _, sizes := range [][]int{{1}, {0, 5, 0, 7}, {2999}, make([]int, 2000)} {
		if len(sizes) == 2000 {
			for i := range sizes {
				sizes[i] = i % 3 // 1998 bytes in 2000 parts, a third empty
			}
		}
		for _, r := range []io.ReaderAt{f, onlyReaderAt{f}} {
			parts, want := make([][]byte, len(sizes)), 0
			for i, n := range sizes {
				parts[i] = make([]byte, n)
				want += n
			}
			require.NoError(t, ReadParts(r, parts, 1))
			require.Equal(t, data[1:1+want], bytes.Join(parts, nil), "%T %v", r, sizes[:min(len(sizes), 4)])
		}
	}
	require.NoError(t, os.Truncate(filepath.Join(dir, "f"), 100))
	for _, r := range []io.ReaderAt{f, onlyReaderAt{f}} {
		err := ReadParts(r, [][]byte{make([]byte, 50), make([]byte, 100)}, 20)
		require.ErrorIs(t, err, ErrChanged, "%T", r)
	}
}

// onlyReaderAt hides every method but ReadAt.
type onlyReaderAt struct{ r io.ReaderAt }

func (o onlyReaderAt) ReadAt(p []byte, off int64) (int, error) { return o.r.ReadAt(p, off) }
