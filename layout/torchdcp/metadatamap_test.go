package torchdcp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/internal/memlimit"
	"github.com/ckptfs/ckptfs/layout/source"
)

// A mapped .metadata cut short while it is decoded is an error naming the
// change, not a SIGBUS that ends the mount.
func TestMappedMetadataTruncated(t *testing.T) {
	p := filepath.Join(t.TempDir(), MetadataFile)
	require.NoError(t, os.WriteFile(p, make([]byte, 1<<20), 0o644))
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	b, err := unix.Mmap(int(f.Fd()), 0, 1<<20, unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(b)
	require.NoError(t, os.Truncate(p, 0))
	err = decodeMapped(b, func(b []byte) error {
		var sum byte
		for i := 0; i < len(b); i += 4096 {
			sum += b[i]
		}
		t.Fatalf("read %d past the end of the file", sum)
		return nil
	})
	assert.True(t, errors.Is(err, source.ErrChanged), "%v", err)
	// Other panics are not taken for a truncation.
	assert.Panics(t, func() { _ = decodeMapped(b, func([]byte) error { panic("boom") }) })
}

// Open decodes a local .metadata mapped, with the same result as read.
func TestOpenMappedMatchesRead(t *testing.T) {
	dir := filepath.Join("testdata", "plain")
	tree, err := source.OpenLocal(dir)
	require.NoError(t, err)
	defer tree.Close()
	var mapped []byte
	require.NoError(t, withMetadata(tree, DefaultMaxMetadataBytes, func(b []byte, _ func(lo, hi int)) error {
		mapped = append([]byte(nil), b...)
		return nil
	}))
	read, err := os.ReadFile(filepath.Join(dir, MetadataFile))
	require.NoError(t, err)
	assert.Equal(t, read, mapped)
	err = withMetadata(tree, 10, func([]byte, func(lo, hi int)) error { return nil })
	assert.ErrorIs(t, err, source.ErrTooLarge)
}

// The releaser drops the pages of a mapped .metadata from the process
// (the mapping's Rss), whole pages inside the range only, and they read
// the same again.
func TestReleaseDropsMappedPages(t *testing.T) {
	const size = 4 << 20
	p := filepath.Join(t.TempDir(), MetadataFile)
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i * 7)
	}
	require.NoError(t, os.WriteFile(p, want, 0o644))
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(b)
	pg := os.Getpagesize()
	require.Equal(t, want, b) // every page read
	require.Equal(t, size, mappedRss(t, b))
	// The first and last pages are not wholly inside (the kernel may drop
	// them too: a huge page's mapping is dropped whole).
	releaser(b, nil)(1, size-1)
	require.LessOrEqual(t, mappedRss(t, b), 2*pg)
	releaser(b, nil)(0, size)
	require.Equal(t, 0, mappedRss(t, b))
	require.Equal(t, want, b, "read again from the page cache")
}

func TestPagesIn(t *testing.T) {
	for _, tc := range []struct{ lo, hi, n, lo2, hi2 int }{
		{0, 0, 100, 0, 0},
		{0, 100, 100, 0, 100}, // the last page, to the end of the file
		{1, 100, 100, 16, 100},
		{0, 99, 100, 0, 96},
		{15, 33, 100, 16, 32},
		{17, 31, 100, 32, 16}, // none
	} {
		lo, hi := pagesIn(tc.lo, tc.hi, tc.n, 16)
		assert.Equal(t, [2]int{tc.lo2, tc.hi2}, [2]int{lo, hi}, "%+v", tc)
	}
}

// mappedRss is the resident bytes of the mapping at b (/proc/self/smaps).
func mappedRss(t *testing.T, b []byte) int {
	smaps, err := os.ReadFile("/proc/self/smaps")
	require.NoError(t, err)
	start := fmt.Sprintf("%x-", uintptr(unsafe.Pointer(&b[0])))
	in := false
	for _, line := range strings.Split(string(smaps), "\n") {
		if strings.HasPrefix(line, start) {
			in = true
			continue
		}
		if kb, ok := strings.CutPrefix(line, "Rss:"); ok && in {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")))
			require.NoError(t, err)
			return n << 10
		}
	}
	t.Fatalf("no mapping at %s in /proc/self/smaps", start)
	return 0
}

// TestMappedMetadataLimit: while a mapped .metadata is decoded, a mount's
// Go limit leaves room for all of it until the decoder drops the pages
// behind it, then for the window it may hold; after, for nothing.
func TestMappedMetadataLimit(t *testing.T) {
	const size = heldWindow + 16<<20
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, MetadataFile), nil, 0o644))
	require.NoError(t, os.Truncate(filepath.Join(dir, MetadataFile), size)) // sparse
	tree, err := source.OpenLocal(dir)
	require.NoError(t, err)
	defer tree.Close()
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	const bound = 1 << 30
	memlimit.Set(bound)
	defer memlimit.Set(0)
	limit := func() int64 { return debug.SetMemoryLimit(-1) }
	require.NoError(t, withMetadata(tree, 1<<30, func(b []byte, release func(lo, hi int)) error {
		require.Len(t, b, size)
		assert.Equal(t, int64(bound-size), limit())
		release(0, 8<<20)
		assert.Equal(t, int64(bound-heldWindow), limit())
		release(8<<20, 16<<20)
		assert.Equal(t, int64(bound-heldWindow), limit())
		return nil
	}))
	assert.Equal(t, int64(bound), limit())
}
