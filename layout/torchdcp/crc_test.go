package torchdcp

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/source"
)

// chunkSource returns the record source of tensor fqn's first chunk.
func chunkSource(t *testing.T, c *ckpt.Checkpoint, fqn string) (*ckpt.Tensor, *recordSource) {
	t.Helper()
	for _, tn := range c.Tensors {
		if tn.Name == fqn {
			return tn, tn.Chunks.At(0).Source.(*recordSource)
		}
	}
	t.Fatalf("no tensor %q", fqn)
	return nil, nil
}

// flipDataByte flips one byte of tensor fqn's data inside its shard, where
// the record's zip directory still holds the CRC32 of the original bytes.
// The file keeps its size; it is changed before Open, so no freshness check
// can notice: only the CRC can.
func flipDataByte(t *testing.T, dir, fqn string) {
	t.Helper()
	c, err := Open(dir)
	require.NoError(t, err)
	_, rs := chunkSource(t, c, fqn)
	loc, err := rs.located()
	require.NoError(t, err)
	at := loc.entryOff + 1
	require.NoError(t, c.Close())

	f, err := os.OpenFile(rs.file.Path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	b := make([]byte, 1)
	_, err = f.ReadAt(b, at)
	require.NoError(t, err)
	b[0] ^= 0x40
	_, err = f.WriteAt(b, at)
	require.NoError(t, err)
}

func assertCRCError(t *testing.T, err error, dir, fqn string) {
	t.Helper()
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrChecksum)
	assert.ErrorIs(t, err, ckpt.ErrInvalid)
	msg := err.Error()
	assert.True(t, strings.HasPrefix(msg, "torchdcp: "+filepath.Join(dir, "__0_0.distcp")+"@"), "names the shard by its full path: %s", msg)
	assert.Contains(t, msg, `tensor "`+fqn+`" chunk (`)
	assert.Contains(t, msg, "CRC32")
	assert.NotContains(t, msg, "\n")
}

func TestRecordCRC(t *testing.T) {
	dir := copyDir(t, "plain")
	flipDataByte(t, dir, "f32")
	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	tn, rs := chunkSource(t, c, "f32")

	// A read of the whole chunk is the whole record entry: checked.
	_, err = treetest.ReadChunk(t, tn, tn.Chunks.At(0))
	assertCRCError(t, err, dir, "f32")
	assert.Contains(t, err.Error(), "in the bytes read")

	// A partial read cannot be checked: it serves the bytes as they are.
	_, err = rs.ReadAt(make([]byte, 4), 4)
	assert.NoError(t, err)

	// Verify reads the entry whole, whatever the reads did.
	assertCRCError(t, rs.Verify(), dir, "f32")
	verified, unverifiable, err := ckpt.VerifyChunks(c)
	assertCRCError(t, err, dir, "f32")
	assert.Zero(t, verified, "f32 is the first chunk")
	assert.Zero(t, unverifiable)

	// The other chunks are intact, and reads of them check out.
	for _, other := range c.Tensors {
		if other.Name == "f32" {
			continue
		}
		_, err := treetest.ReadChunk(t, other, other.Chunks.At(0))
		require.NoError(t, err, other.Name)
		require.NoError(t, other.Chunks.At(0).Source.(ckpt.Verifier).Verify(), other.Name)
	}
}

func TestVerifyChunksOfFixtures(t *testing.T) {
	for _, name := range checkpoints {
		t.Run(name, func(t *testing.T) {
			c, err := Open(filepath.Join("testdata", name))
			require.NoError(t, err)
			defer c.Close()
			chunks := 0
			for _, tn := range c.Tensors {
				chunks += tn.Chunks.Len()
			}
			verified, unverifiable, err := ckpt.VerifyChunks(c)
			require.NoError(t, err)
			assert.Equal(t, chunks, verified)
			assert.Zero(t, unverifiable)
		})
	}
}

// TestZstdRecordCRC recompresses a record of the zstd fixture with one data
// byte flipped, as valid zstd, and points the chunk at it: decompression
// succeeds, and the CRC32 of the record catches the change.
func TestZstdRecordCRC(t *testing.T) {
	const fqn = "model.l1.weight"
	dir := copyDir(t, "zstd")
	m, err := decodeFile(t, filepath.Join(dir, MetadataFile))
	require.NoError(t, err)
	info, ok := m.Lookup(fqn, []int64{0, 0})
	require.True(t, ok)
	shardPath := filepath.Join(dir, info.RelativePath)
	shard, err := os.ReadFile(shardPath)
	require.NoError(t, err)

	dec, err := zstd.NewReader(bytes.NewReader(shard[info.Offset : info.Offset+info.Length]))
	require.NoError(t, err)
	record, err := io.ReadAll(dec)
	dec.Close()
	require.NoError(t, err)
	loc, err := locateRecord(bytes.NewReader(record), int64(len(record)), recordWant{DType: "float32", ElemSize: 4, Sizes: []int64{4, 3}})
	require.NoError(t, err)
	record[loc.entryOff] ^= 0x40
	enc, err := zstd.NewWriter(nil)
	require.NoError(t, err)
	bad := enc.EncodeAll(record, nil)

	f, err := os.OpenFile(shardPath, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write(bad)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	setStorage(m, fqn, func(i *StorageInfo) { i.Offset, i.Length = int64(len(shard)), int64(len(bad)) })

	tree, err := source.OpenLocal(dir)
	require.NoError(t, err)
	defer tree.Close()
	c, err := OpenDecoded(tree, m, Options{})
	require.NoError(t, err)
	defer c.Close()
	tn, rs := chunkSource(t, c, fqn)
	_, err = treetest.ReadChunk(t, tn, tn.Chunks.At(0))
	assertCRCError(t, err, dir, fqn)
	assert.Contains(t, err.Error(), "after decompression")
	assert.Contains(t, err.Error(), "(zstd)")
	// A partial read needs the whole record too, so it is refused as well.
	_, err = rs.ReadAt(make([]byte, 4), 4)
	assert.True(t, errors.Is(err, ErrChecksum), "%v", err)
}
