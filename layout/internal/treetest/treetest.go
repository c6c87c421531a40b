// Package treetest has test helpers for code that reads a source tree.
package treetest

import (
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/safetensors"
)

// Detect runs a format's Detect on the local directory dir.
func Detect(t testing.TB, r ckpt.Reader, dir string) bool {
	t.Helper()
	tree, err := source.OpenLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	return r.Detect(tree)
}

// Testdata is the path of the repository's testdata/ folder, from any
// package's tests.
func Testdata(elem ...string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(append([]string{filepath.Dir(file), "..", "..", "..", "testdata"}, elem...)...)
}

// CopyFixture copies the checkpoint of the fixture testdata/name into dir.
func CopyFixture(t testing.TB, name, dir string) {
	t.Helper()
	if err := os.CopyFS(dir, os.DirFS(Testdata(name, "ckpt"))); err != nil {
		t.Fatal(err)
	}
}

// MemSource is a chunk held in memory; it counts reads so tests can check
// how a view reads its sources.
type MemSource struct {
	Data  []byte
	Reads int
}

func (m *MemSource) ReadAt(p []byte, off int64) (int, error) {
	m.Reads++
	return copy(p, m.Data[off:]), nil
}

func (m *MemSource) String() string { return "mem" }

// Scalar is a 2-element f32 tensor held in memory, saved at path.
func Scalar(name string, path ...string) *ckpt.Tensor {
	return &ckpt.Tensor{Name: name, Path: path, DType: safetensors.F32, Shape: []int64{2},
		Chunks: ckpt.MakeChunks(ckpt.Chunk{Offsets: []int64{0}, Sizes: []int64{2}, Source: &MemSource{Data: make([]byte, 8)}})}
}

// NewCheckpoint is a checkpoint of in-memory tensors whose directory (for
// sidecars) is dir.
func NewCheckpoint(t testing.TB, dir string, tensors ...*ckpt.Tensor) *ckpt.Checkpoint {
	t.Helper()
	tree, err := source.OpenLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := ckpt.NewFileSet(tree)
	files.Adopt(tree)
	t.Cleanup(func() { files.Close() })
	return &ckpt.Checkpoint{Dir: dir, Files: files, Tensors: tensors}
}

// OpenLocal opens the local directory dir as a confined tree and the
// checkpoint in it with open; the checkpoint owns the tree.
func OpenLocal(dir string, open func(source.Tree) (*ckpt.Checkpoint, error)) (*ckpt.Checkpoint, error) {
	tree, err := source.OpenLocal(dir)
	if err != nil {
		return nil, err
	}
	c, err := open(tree)
	if err != nil {
		tree.Close()
		return nil, err
	}
	c.Files.Adopt(tree)
	return c, nil
}

// ReadChunk reads a chunk's bytes through its Source (a read that fills the
// chunk and says io.EOF succeeded).
func ReadChunk(t testing.TB, tn *ckpt.Tensor, c ckpt.Chunk) ([]byte, error) {
	t.Helper()
	n, err := ckpt.NumElements(c.Sizes)
	if err != nil {
		t.Fatalf("%s: %v", tn.Name, err)
	}
	buf := make([]byte, n*int64(tn.DType.Size()))
	got, err := c.Source.ReadAt(buf, 0)
	if err == io.EOF && got == len(buf) {
		err = nil
	}
	return buf[:got], err
}

// ReadChunks reads the first bytes (up to 64 KiB) of every chunk of c,
// errors ignored: a fuzz target of a reader calls it so that the sources
// of what Open accepted are read too. Open validated c: a chunk whose size
// does not count is a test failure.
func ReadChunks(t testing.TB, c *ckpt.Checkpoint) {
	t.Helper()
	for _, tn := range c.Tensors {
		for _, ch := range tn.Chunks.All() {
			n, err := ckpt.NumElements(ch.Sizes)
			if err != nil {
				t.Fatalf("%s: a chunk Open let through: %v", tn.Name, err)
			}
			buf := make([]byte, min(n*int64(tn.DType.Size()), 64<<10))
			_, _ = ch.Source.ReadAt(buf, 0)
		}
	}
}

// OpenWritten is a reader's fuzz target body: it writes files (a relative
// path, slash-separated, to its bytes) into a fresh directory, opens the
// checkpoint there with open, and reads what it accepted (ReadChunks). A
// hostile input may fail to open; it must never panic.
func OpenWritten(t *testing.T, files map[string][]byte, open func(source.Tree) (*ckpt.Checkpoint, error)) {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c, err := OpenLocal(dir, open)
	if err != nil {
		return
	}
	defer c.Close()
	ReadChunks(t, c)
}

// CountingTree counts, per file name, the opens, reads and freshness
// checks of the files it opens, so that a test can check how a reader
// reads a checkpoint. Safe for concurrent use (a read plan reads files at
// once).
type CountingTree struct {
	source.Tree
	mu     sync.Mutex
	counts map[string]*Counts
}

// OpenCounting opens the local folder dir through a CountingTree, closed
// when the test ends.
func OpenCounting(t testing.TB, dir string) *CountingTree {
	t.Helper()
	local, err := source.OpenLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { local.Close() })
	return &CountingTree{Tree: local}
}

// Counts are what a CountingTree counted of one file.
type Counts struct{ Opens, Reads, Checks int }

// Count returns a copy of the counts by file name.
func (t *CountingTree) Count() map[string]Counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]Counts{}
	for k, v := range t.counts {
		out[k] = *v
	}
	return out
}

// Reset sets every count to zero.
func (t *CountingTree) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.counts = nil
}

func (t *CountingTree) add(name string, fn func(*Counts)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.counts == nil {
		t.counts = map[string]*Counts{}
	}
	c := t.counts[name]
	if c == nil {
		c = &Counts{}
		t.counts[name] = c
	}
	fn(c)
}

func (t *CountingTree) Open(name string) (source.File, error) {
	f, err := t.Tree.Open(name)
	if err != nil {
		return nil, err
	}
	t.add(name, func(c *Counts) { c.Opens++ })
	return &countingFile{File: f, tree: t, name: name}, nil
}

type countingFile struct {
	source.File
	tree *CountingTree
	name string
}

func (f *countingFile) ReadAt(p []byte, off int64) (int, error) {
	f.tree.add(f.name, func(c *Counts) { c.Reads++ })
	return f.File.ReadAt(p, off)
}

func (f *countingFile) ReadvAt(parts [][]byte, off int64) error {
	f.tree.add(f.name, func(c *Counts) { c.Reads++ })
	return f.File.(source.VectoredReader).ReadvAt(parts, off)
}

func (f *countingFile) Check() error {
	f.tree.add(f.name, func(c *Counts) { c.Checks++ })
	return f.File.Check()
}
