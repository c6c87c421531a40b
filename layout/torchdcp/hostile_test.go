package torchdcp

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/cost"
	"github.com/ckptfs/ckptfs/layout/pickle"
)

// memoBombMetadata is a .metadata "billion laughs": a Metadata whose
// state_dict_metadata has one key, a tuple of ten memo references to a tuple
// of ten references ... nine levels deep (10^9 values in 305 bytes). Before
// the decoder counted memo references, it took minutes and gigabytes.
func memoBombMetadata() []byte {
	var b strings.Builder
	b.WriteString("\x80\x02c" + modMetadata + "\nMetadata\n)\x81}X\x13\x00\x00\x00state_dict_metadata}")
	b.WriteString("K\x01q\x00")
	const levels = 9
	for l := 1; l <= levels; l++ {
		b.WriteString("(" + strings.Repeat("h"+string(rune(l-1)), 10) + "tq" + string(rune(l)))
	}
	b.WriteString("h" + string(rune(levels)) + "Nssb.")
	return []byte(b.String())
}

// The same bytes are kept in testdata/hostile for tests that run every hostile
// input through inspect, export and a mount.
const memoBombFile = "../../testdata/hostile/metadata-memo-bomb/.metadata"

func TestMetadataMemoBomb(t *testing.T) {
	data := memoBombMetadata()
	committed, err := os.ReadFile(memoBombFile)
	require.NoError(t, err)
	require.Equal(t, data, committed, "%s is stale: write memoBombMetadata() there", memoBombFile)

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, MetadataFile), data, 0o644))

	var c *ckpt.Checkpoint
	took := cost.Of(func() { c, err = Open(dir) })
	require.Error(t, err, "opened %+v", c)
	assert.Less(t, took.CPU, time.Second)
	assert.Less(t, took.Alloc, uint64(32<<20), "bytes allocated")
	msg := err.Error()
	assert.NotContains(t, msg, "\n")
	assert.True(t, strings.HasPrefix(msg, "torchdcp: "+filepath.Join(dir, MetadataFile)+": pickle: more than 1048576 container items"), msg)
	assert.True(t, errors.Is(err, ckpt.ErrInvalid))
	assert.True(t, errors.Is(err, pickle.ErrLimit))
}

// A real .metadata expands to about 0.3 values per byte; the per-byte bound
// leaves room for any real one however large.
func TestMetadataExpansionOfFixtures(t *testing.T) {
	files, err := filepath.Glob("../../testdata/*/ckpt/" + MetadataFile)
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		_, err = pickle.DecodeBytes(b, pickle.Options{MaxItems: int64(len(b)) / 2})
		assert.NoError(t, err, "%s expands to more than half a value per byte", f)
	}
}
