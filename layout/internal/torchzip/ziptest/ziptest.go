// Package ziptest makes hostile torch.save archives for tests: a real
// archive rewritten with one entry compressed, which torchzip.Open refuses
// whichever reader opens it.
package ziptest

import (
	"archive/zip"
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Deflate rewrites the zip archive b with every entry whose name ends in
// suffix compressed (deflate), the others stored as they were.
func Deflate(t testing.TB, b []byte, suffix string) []byte {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	require.NoError(t, err)
	var out bytes.Buffer
	zw := zip.NewWriter(&out)
	n := 0
	for _, e := range zr.File {
		method := zip.Store
		if strings.HasSuffix(e.Name, suffix) {
			method = zip.Deflate
			n++
		}
		w, err := zw.CreateHeader(&zip.FileHeader{Name: e.Name, Method: method})
		require.NoError(t, err)
		rc, err := e.Open()
		require.NoError(t, err)
		_, err = io.Copy(w, rc)
		require.NoError(t, err)
		require.NoError(t, rc.Close())
	}
	require.NoError(t, zw.Close())
	require.NotZero(t, n, "no entry ends in %q", suffix)
	return out.Bytes()
}
