package view

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
)

// A byte flipped inside a record is not seen by a read of another part of
// the chunk; with Verify, the first read of the chunk checks the whole
// record's CRC32 and fails.
func TestVerifyCatchesWhatPartialReadsMiss(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ck")
	data := flipChunkByte(t, dir)
	for _, verify := range []bool{false, true} {
		c, err := layout.Open(dir)
		require.NoError(t, err)
		if verify {
			checked, unchecked := Verify(c)
			require.Positive(t, checked)
			require.Zero(t, unchecked)
		}
		head := make([]byte, 4)
		_, err = c.Tensors[0].Chunks.At(0).Source.ReadAt(head, 0)
		if verify {
			require.ErrorIs(t, err, torchdcp.ErrChecksum)
			require.ErrorContains(t, err, "CRC32 mismatch")
		} else {
			require.NoError(t, err, "a partial read does not check the record")
			require.Equal(t, data[:4], head)
		}
		c.Close()
	}
}

// flipChunkByte copies the fsdp2_4ranks fixture to dir and flips the last
// byte of its first tensor's first chunk in its shard, where the record's
// zip directory keeps the CRC32 of the bytes as written. It returns the
// chunk's bytes as written.
func flipChunkByte(t *testing.T, dir string) []byte {
	t.Helper()
	treetest.CopyFixture(t, "fsdp2_4ranks", dir)
	c, err := layout.Open(dir)
	require.NoError(t, err)
	ch := c.Tensors[0].Chunks.At(0) // emb.weight, [10 8] f32 on 4 ranks
	n, _ := ckpt.NumElements(ch.Sizes)
	data := make([]byte, n*4)
	_, err = ch.Source.ReadAt(data, 0)
	require.NoError(t, err)
	c.Close()
	shards, _ := filepath.Glob(filepath.Join(dir, "*.distcp"))
	for _, s := range shards {
		b, err := os.ReadFile(s)
		require.NoError(t, err)
		if i := bytes.Index(b, data); i >= 0 {
			b[i+len(data)-1] ^= 0xff
			require.NoError(t, os.WriteFile(s, b, 0o644))
			return data
		}
	}
	t.Fatal("the chunk's bytes are in no shard")
	return nil
}
