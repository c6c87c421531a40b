package safetensors

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzReadHeader checks that ReadHeader never panics, that every error from
// an in-memory file is a format error, and that an accepted header
// round-trips through EncodeHeader and Writer unchanged.
func FuzzReadHeader(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.safetensors"))
	require.NoError(f, err)
	require.NotEmpty(f, files)
	for _, file := range files {
		b, err := os.ReadFile(file)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ReadHeader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidHeader)
			require.Nil(t, h)
			return
		}
		checkHeader(t, h, b)
		roundTrip(t, h, b[h.DataStart:])
	})
}
