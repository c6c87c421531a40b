package torchdcp_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/layout/torchdcp/dcptest"
)

// readAll reads every chunk of every tensor, its bytes one after the other.
func readAll(t *testing.T, c *ckpt.Checkpoint) ([]byte, error) {
	var out []byte
	for _, tn := range c.Tensors {
		for _, ch := range tn.Chunks.All() {
			b, err := treetest.ReadChunk(t, tn, ch)
			if err != nil {
				return nil, err
			}
			out = append(out, b...)
		}
	}
	return out, nil
}

// TestResidentCountsSpooledRecords: a zstd chunk whose record is spooled
// to a file (larger than memRecordLimit: here every one) keeps its file
// open; the checkpoint counts that from its open (spooledBytes), and the
// heap it holds once every chunk is read is within its count.
func TestResidentCountsSpooledRecords(t *testing.T) {
	torchdcp.SetMemRecordLimit(t, 100)
	torchdcp.SetRecordBudget(t, 0) // none kept in memory: the count is the spooled ones'
	warm := t.TempDir()
	dcptest.WriteChunked(t, warm, 4, true)
	wc, err := torchdcp.OpenWith(warm, torchdcp.Options{TempDir: t.TempDir()})
	require.NoError(t, err)
	_, err = readAll(t, wc)
	require.NoError(t, err)
	require.NoError(t, wc.Close())

	const n = 300
	dir := t.TempDir()
	dcptest.WriteChunked(t, dir, n, true)
	before := testenv.LiveHeap()
	c, err := torchdcp.OpenWith(dir, torchdcp.Options{TempDir: t.TempDir()})
	require.NoError(t, err)
	defer c.Close()
	atOpen := c.ResidentBytes()
	_, err = readAll(t, c)
	require.NoError(t, err)
	held := testenv.LiveHeap() - before
	t.Logf("%d chunks spooled: counted %d at open, heap held %d (%d a chunk)", 2*n, atOpen, held, held/(2*n))
	assert.Equal(t, atOpen, c.ResidentBytes())
	assert.LessOrEqual(t, held, atOpen)
}

// TestRecordsDecompressedAgain: with room for one small record, every
// chunk read drops the last one's, and a chunk read again decompresses its
// record again: the same bytes as the records stored, and, once the shard
// is rewritten, the change as the error, where a record kept in memory
// would not see it.
func TestRecordsDecompressedAgain(t *testing.T) {
	torchdcp.SetRecordBudget(t, 1)
	const n = 200
	ref, dir := t.TempDir(), t.TempDir()
	dcptest.WriteChunked(t, ref, n, false)
	dcptest.WriteChunked(t, dir, n, true)
	rc, err := torchdcp.Open(ref)
	require.NoError(t, err)
	want, err := readAll(t, rc)
	require.NoError(t, err)
	require.NoError(t, rc.Close())

	c, err := torchdcp.Open(dir)
	require.NoError(t, err)
	defer c.Close()
	for range 2 {
		got, err := readAll(t, c)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	shard := filepath.Join(dir, torchdcp.ShardName(0, 0))
	b, err := os.ReadFile(shard)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(shard, b, 0o644))
	_, err = treetest.ReadChunk(t, c.Tensors[0], c.Tensors[0].Chunks.At(0))
	require.ErrorIs(t, err, ckpt.ErrSourceChanged)
}

// BenchmarkSmallRecordReads reads every chunk of zstd records of 512 KiB
// in 128 KiB pieces, as FUSE asks for them: chunk after chunk (each
// record decompressed once, then kept), and piece k of every chunk in
// turn with room for one record (each piece decompresses its record
// again: what keeping none would cost). MB/s of chunk bytes.
func BenchmarkSmallRecordReads(b *testing.B) {
	const n, k, piece = 8, 128 << 10, 128 << 10 // 8 chunks of 512 KiB a tensor
	dir := b.TempDir()
	dcptest.WriteWide(b, dir, n, k, true)
	for _, kept := range []bool{true, false} {
		b.Run(map[bool]string{true: "kept", false: "decompressed-each-read"}[kept], func(b *testing.B) {
			if !kept {
				torchdcp.SetRecordBudget(b, 1)
			}
			buf := make([]byte, piece)
			var bytes int64
			for b.Loop() {
				c, err := torchdcp.Open(dir)
				if err != nil {
					b.Fatal(err)
				}
				for _, tn := range c.Tensors {
					size := int64(4 * k)
					if kept {
						for i := range tn.Chunks.Len() {
							for p := int64(0); p < size; p += piece {
								if _, err := tn.Chunks.Source(i).ReadAt(buf, p); err != nil {
									b.Fatal(err)
								}
								bytes += piece
							}
						}
					} else {
						for p := int64(0); p < size; p += piece {
							for i := range tn.Chunks.Len() {
								if _, err := tn.Chunks.Source(i).ReadAt(buf, p); err != nil {
									b.Fatal(err)
								}
								bytes += piece
							}
						}
					}
				}
				c.Close()
			}
			b.ReportMetric(float64(bytes)/1e6/b.Elapsed().Seconds(), "MB/s")
		})
	}
}
