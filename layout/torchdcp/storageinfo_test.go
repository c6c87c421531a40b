package torchdcp

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFrameworkStorageInfo: OLMo-core's save_model_and_optim_state pickles
// its own _StorageInfo dataclass; both decoders take it by its fields, as
// torch's, and the checkpoint opens. A class of the same name in any other
// module is refused by both, in the same words.
func TestFrameworkStorageInfo(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "olmocore_llama", "ckpt")
	b, err := os.ReadFile(filepath.Join(dir, MetadataFile))
	require.NoError(t, err)
	const mod = "olmo_core.distributed.checkpoint.filesystem"
	require.Contains(t, string(b), mod)
	st := checkStream(t, b)
	require.NotNil(t, st, "the stream takes OLMo-core's entries")
	require.Zero(t, st.built, "every chunk, index and storage entry is read as a record, OLMo-core's too")
	m, err := decodeMetadataBytes(b, DefaultMaxMetadataBytes)
	require.NoError(t, err)
	info, ok := m.Lookup("model.embeddings.weight", []int64{0, 0})
	require.True(t, ok)
	require.Equal(t, "__0_0.distcp", info.RelativePath)

	for _, other := range []string{"olmo_cake.distributed.checkpoint.filesystem", "torch.distributed.checkpoint.filesystex_xyz"} {
		require.Len(t, other, len(mod)) // the pickle's lengths stay right
		forged := bytes.ReplaceAll(b, []byte(mod), []byte(other))
		checkStream(t, forged)
		_, err := decodeMetadataBytes(forged, DefaultMaxMetadataBytes)
		require.ErrorContains(t, err, "expected _StorageInfo, got object "+other+"._StorageInfo")
	}
}
