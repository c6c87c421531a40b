package torchdcp

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

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
	require.NoError(t, withMetadata(tree, DefaultMaxMetadataBytes, func(b []byte) error {
		mapped = append([]byte(nil), b...)
		return nil
	}))
	read, err := os.ReadFile(filepath.Join(dir, MetadataFile))
	require.NoError(t, err)
	assert.Equal(t, read, mapped)
	err = withMetadata(tree, 10, func([]byte) error { return nil })
	assert.ErrorIs(t, err, source.ErrTooLarge)
}
