package diskcache

import (
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
)

// counting is a tree whose file reads are counted: what the cache saves.
type counting struct {
	source.Tree
	reads *atomic.Int64
}

func (c counting) Open(name string) (source.File, error) {
	f, err := c.Tree.Open(name)
	if err != nil {
		return nil, err
	}
	return countingFile{f, c.reads}, nil
}

type countingFile struct {
	source.File
	reads *atomic.Int64
}

func (f countingFile) ReadAt(p []byte, off int64) (int, error) {
	f.reads.Add(1)
	return f.File.ReadAt(p, off)
}

func setup(t *testing.T, size int) (dir string, data []byte, base counting) {
	dir = t.TempDir()
	data = make([]byte, size)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "shard"), data, 0o644))
	local, err := source.OpenLocal(dir)
	require.NoError(t, err)
	t.Cleanup(func() { local.Close() })
	return dir, data, counting{local, new(atomic.Int64)}
}

func open(t *testing.T, dir string, max int64) *Cache {
	c, err := Open(Options{Dir: dir, MaxBytes: max, BlockSize: 1000})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// readAll checks reads at random offsets and lengths against data.
func readAll(t *testing.T, f source.File, data []byte, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	for range 200 {
		off := rng.IntN(len(data) + 10)
		buf := make([]byte, rng.IntN(3000))
		n, err := f.ReadAt(buf, int64(off))
		want := data[min(off, len(data)):min(off+len(buf), len(data))]
		if len(want) < len(buf) {
			require.ErrorIs(t, err, io.EOF)
		} else {
			require.NoError(t, err)
		}
		require.Equal(t, len(want), n)
		require.True(t, bytes.Equal(want, buf[:n]), "read %d+%d", off, len(buf))
	}
}

func TestReadsAndRestart(t *testing.T) {
	src, data, base := setup(t, 10_500)
	cdir := filepath.Join(t.TempDir(), "cache")
	c := open(t, cdir, 1<<20)
	f, err := c.Wrap(base).Open("shard")
	require.NoError(t, err)
	readAll(t, f, data, 1)
	assert.Equal(t, int64(11), base.reads.Load(), "each block fetched once")
	st := c.Stats()
	assert.Equal(t, int64(11), st.DiskMisses)
	assert.Equal(t, int64(11*headerSize+len(data)), st.DiskBytes)
	require.NoError(t, c.Close())

	// A restarted process finds every block on disk.
	c = open(t, cdir, 1<<20)
	f, err = c.Wrap(base).Open("shard")
	require.NoError(t, err)
	readAll(t, f, data, 2)
	assert.Equal(t, int64(11), base.reads.Load(), "nothing fetched after the restart")
	assert.Zero(t, c.Stats().DiskMisses)

	// A new version of the file has new keys: nothing old is served.
	data[0] ^= 0xff
	require.NoError(t, os.WriteFile(filepath.Join(src, "shard"), data, 0o644))
	f, err = c.Wrap(base).Open("shard")
	require.NoError(t, err)
	readAll(t, f, data, 3)
	assert.Equal(t, int64(22), base.reads.Load())
}

// filled reads data (the file "shard" of base) once through a cache in
// cdir, closes it, and returns its 5 block files.
func filled(t *testing.T, cdir string, base counting, data []byte) []string {
	t.Helper()
	c := open(t, cdir, 1<<20)
	f, err := c.Wrap(base).Open("shard")
	require.NoError(t, err)
	readAll(t, f, data, 1)
	require.NoError(t, c.Close())
	blocks, err := filepath.Glob(filepath.Join(cdir, "*"+suffix))
	require.NoError(t, err)
	require.Len(t, blocks, 5)
	return blocks
}

// TestCorruptBlocks: blocks damaged on disk between two processes (a torn
// write, a flipped bit) are caught by their CRC when the next process first
// reads them, and one removed behind a running process's back is caught by
// the read; each is fetched again, and the bytes are exact.
func TestCorruptBlocks(t *testing.T) {
	_, data, base := setup(t, 5000)
	cdir := t.TempDir()
	blocks := filled(t, cdir, base, data)
	for i, damage := range []func(b []byte) []byte{
		func(b []byte) []byte { b[len(b)-1] ^= 1; return b }, // a flipped bit
		func(b []byte) []byte { return b[:len(b)-10] },       // truncated
		func(b []byte) []byte { return nil },                 // empty
		func(b []byte) []byte { copy(b, "XXXXXXXX"); return b },
	} {
		b, err := os.ReadFile(blocks[i])
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(blocks[i], damage(b), 0o600))
	}
	c := open(t, cdir, 1<<20)
	f, err := c.Wrap(base).Open("shard")
	require.NoError(t, err)
	readAll(t, f, data, 2)
	assert.Equal(t, int64(4), c.Stats().DiskErrors)
	assert.Equal(t, int64(9), base.reads.Load(), "each bad block fetched again, once")

	require.NoError(t, os.Remove(blocks[4]))
	readAll(t, f, data, 3)
	assert.Equal(t, int64(5), c.Stats().DiskErrors)
	assert.Equal(t, int64(10), base.reads.Load())
}

func TestBounded(t *testing.T) {
	_, data, base := setup(t, 20_000)
	cdir := t.TempDir()
	max := int64(5 * (1000 + headerSize))
	c := open(t, cdir, max)
	f, err := c.Wrap(base).Open("shard")
	require.NoError(t, err)
	for off := 0; off < len(data); off += 700 {
		buf := make([]byte, 700)
		_, err := f.ReadAt(buf, int64(off))
		if err != io.EOF {
			require.NoError(t, err)
		}
		require.LessOrEqual(t, c.Stats().DiskBytes, max)
	}
	blocks, err := filepath.Glob(filepath.Join(cdir, "*"+suffix))
	require.NoError(t, err)
	assert.Len(t, blocks, 5, "only the most recent blocks stay on disk")
	// The last blocks read are the ones kept.
	before := base.reads.Load()
	buf := make([]byte, 1000)
	_, err = f.ReadAt(buf, 19_000)
	require.NoError(t, err)
	assert.Equal(t, before, base.reads.Load())
	// Reopening a directory over its bound trims it.
	require.NoError(t, c.Close())
	c = open(t, cdir, int64(2*(1000+headerSize)))
	assert.Equal(t, int64(2*(1000+headerSize)), c.Stats().DiskBytes)
}

func TestOneProcess(t *testing.T) {
	cdir := t.TempDir()
	open(t, cdir, 1<<20)
	_, err := Open(Options{Dir: cdir, MaxBytes: 1 << 20, BlockSize: 1000})
	require.ErrorIs(t, err, source.ErrLocked)
	assert.True(t, strings.Contains(err.Error(), cdir), err.Error())
}

// TestRestartKeepsNewest: a directory over its bound is trimmed oldest
// written first.
func TestRestartKeepsNewest(t *testing.T) {
	_, data, base := setup(t, 5000)
	cdir := t.TempDir()
	blocks := filled(t, cdir, base, data)
	now := time.Now()
	for i, b := range blocks {
		mtime := now.Add(time.Duration(i) * time.Minute)
		require.NoError(t, os.Chtimes(b, mtime, mtime))
	}
	open(t, cdir, int64(2*(1000+headerSize)))
	left, err := filepath.Glob(filepath.Join(cdir, "*"+suffix))
	require.NoError(t, err)
	assert.ElementsMatch(t, blocks[3:], left)
}
