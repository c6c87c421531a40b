package torchzip

import (
	"archive/zip"
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type entry struct {
	name   string
	data   string
	method uint16
}

func archiveOf(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := zip.NewWriter(&buf)
	for _, e := range entries {
		f, err := w.CreateHeader(&zip.FileHeader{Name: e.name, Method: e.method})
		require.NoError(t, err)
		_, err = f.Write([]byte(e.data))
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
	return buf.Bytes()
}

func TestOpenHostile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []entry
		err     string
	}{
		{"no entries", nil, "has no entries"},
		{"no top-level folder", []entry{{name: "data.pkl"}}, "has no top-level folder"},
		{"an entry twice", []entry{{name: "a/data.pkl"}, {name: "a/data/0"}, {name: "a/data.pkl"}}, "a/data.pkl appears twice"},
		{"big-endian", []entry{{name: "a/data.pkl"}, {name: "a/byteorder", data: "big"}}, `byteorder "big" is not supported`},
		{"a compressed entry", []entry{{name: "a/data.pkl", data: "p"}, {name: "a/data/1", data: "zz", method: zip.Deflate}}, "entry a/data/1 is compressed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := archiveOf(t, tc.entries...)
			_, err := Open(bytes.NewReader(b), int64(len(b)))
			require.ErrorContains(t, err, tc.err)
		})
	}
}

func TestArchiveEntries(t *testing.T) {
	b := archiveOf(t, entry{name: "a/data.pkl", data: "p"}, entry{name: "a/byteorder", data: "little"},
		entry{name: "a/data/0", data: "0123"})
	a, err := Open(bytes.NewReader(b), int64(len(b)))
	require.NoError(t, err)
	assert.Equal(t, "a", a.Prefix)
	assert.Len(t, a.Files, 3)
	e, err := a.Entry("data/0")
	require.NoError(t, err)
	assert.Equal(t, "a/data/0", e.Name)
	_, err = a.Entry("data/2")
	require.ErrorContains(t, err, "has no a/data/2")
}
