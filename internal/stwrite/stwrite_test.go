package stwrite

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/safetensors"
)

// pattern is n bytes of a repeating, non-periodic-in-8 sequence.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

func TestWriter(t *testing.T) {
	tensors := safetensors.Layout([]safetensors.TensorInfo{
		{Name: "a", DType: safetensors.F32, Shape: []int64{2}},
		{Name: "b", DType: safetensors.U8, Shape: []int64{3}},
	})
	hdr, err := safetensors.EncodeHeader(nil, tensors)
	require.NoError(t, err)

	t.Run("in pieces", func(t *testing.T) {
		var buf bytes.Buffer
		w, err := NewWriter(&buf, nil, tensors)
		require.NoError(t, err)
		assert.Equal(t, hdr, buf.Bytes(), "header written immediately")
		data := pattern(11)
		for _, p := range [][]byte{data[:3], nil, data[3:8], data[8:]} {
			n, err := w.Write(p)
			require.NoError(t, err)
			assert.Equal(t, len(p), n)
		}
		assert.Zero(t, w.Remaining())
		require.NoError(t, w.Close())
		require.NoError(t, w.Close())
		assert.Equal(t, append(hdr, data...), buf.Bytes())
		_, err = w.Write([]byte{1})
		assert.ErrorIs(t, err, ErrWriterClosed)
	})
	t.Run("too long", func(t *testing.T) {
		var buf bytes.Buffer
		w, err := NewWriter(&buf, nil, tensors)
		require.NoError(t, err)
		n, err := w.Write(pattern(10))
		require.NoError(t, err)
		assert.Equal(t, 10, n)
		n, err = w.Write([]byte{1, 2, 3})
		assert.ErrorIs(t, err, ErrWriteTooLong)
		assert.Equal(t, 1, n, "writes what fits")
		n, err = w.Write([]byte{4})
		assert.ErrorIs(t, err, ErrWriteTooLong)
		assert.Zero(t, n)
		require.NoError(t, w.Close())
		assert.Len(t, buf.Bytes(), len(hdr)+11)
	})
	t.Run("short", func(t *testing.T) {
		w, err := NewWriter(io.Discard, nil, tensors)
		require.NoError(t, err)
		_, err = w.Write(pattern(4))
		require.NoError(t, err)
		err = w.Close()
		assert.ErrorIs(t, err, ErrShortData)
		assert.EqualError(t, err, "stwrite: fewer data bytes than the header declares: 7 bytes missing")
		assert.Equal(t, err, w.Close(), "Close is idempotent")
	})
	t.Run("underlying error", func(t *testing.T) {
		boom := errors.New("boom")
		fw := &failWriter{after: len(hdr) + 2, err: boom}
		w, err := NewWriter(fw, nil, tensors)
		require.NoError(t, err)
		n, err := w.Write(pattern(5))
		assert.ErrorIs(t, err, boom)
		assert.Equal(t, 2, n)
		_, err = w.Write(pattern(1))
		assert.ErrorIs(t, err, boom, "sticky")
		assert.ErrorIs(t, w.Close(), boom)
	})
	t.Run("invalid header", func(t *testing.T) {
		_, err := NewWriter(io.Discard, nil, []safetensors.TensorInfo{{Name: "a", DType: safetensors.F32, Shape: []int64{2}, End: 4}})
		assert.ErrorIs(t, err, safetensors.ErrInvalidHeader)
	})
	t.Run("header write error", func(t *testing.T) {
		boom := errors.New("boom")
		w, err := NewWriter(&failWriter{after: 3, err: boom}, nil, tensors)
		assert.Nil(t, w)
		assert.ErrorIs(t, err, boom)
		assert.ErrorContains(t, err, "stwrite: writing header")
	})
}

// failWriter accepts after bytes, then fails.
type failWriter struct {
	after int
	err   error
}

func (f *failWriter) Write(p []byte) (int, error) {
	if len(p) <= f.after {
		f.after -= len(p)
		return len(p), nil
	}
	n := f.after
	f.after = 0
	return n, f.err
}

// TestSortForWrite checks SortForWrite against the order Python's writer
// chose for the files in testdata.
func TestSortForWrite(t *testing.T) {
	for _, file := range []string{"python_numpy.safetensors", "python_raw.safetensors"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "safetensors", "testdata", file))
		require.NoError(t, err)
		h, err := safetensors.ReadHeader(bytes.NewReader(b), int64(len(b)))
		require.NoError(t, err)
		got := slices.Clone(h.Tensors)
		slices.Reverse(got)
		SortForWrite(got)
		assert.Equal(t, h.Tensors, got, file)
	}
	// Every dtype, in the order safetensors 0.8.0 serialize() wrote them
	// (F6_* are not accepted by its Python API; their place is from the
	// crate's Dtype enum).
	tensors := []safetensors.TensorInfo{}
	for _, d := range []safetensors.DType{safetensors.BOOL, safetensors.F4, safetensors.F6_E2M3, safetensors.F6_E3M2, safetensors.U8, safetensors.I8, safetensors.F8_E5M2, safetensors.F8_E4M3, safetensors.F8_E8M0, safetensors.F8_E4M3FNUZ, safetensors.F8_E5M2FNUZ,
		safetensors.I16, safetensors.U16, safetensors.F16, safetensors.BF16, safetensors.I32, safetensors.U32, safetensors.F32, safetensors.C64, safetensors.F64, safetensors.I64, safetensors.U64} {
		tensors = append(tensors, safetensors.TensorInfo{Name: "z", DType: d}, safetensors.TensorInfo{Name: "a", DType: d})
	}
	SortForWrite(tensors)
	var got []string
	for _, ti := range tensors {
		got = append(got, ti.Name+":"+string(ti.DType))
	}
	assert.Equal(t, []string{"a:U64", "z:U64", "a:I64", "z:I64", "a:F64", "z:F64", "a:C64", "z:C64",
		"a:F32", "z:F32", "a:U32", "z:U32", "a:I32", "z:I32", "a:BF16", "z:BF16", "a:F16", "z:F16",
		"a:U16", "z:U16", "a:I16", "z:I16", "a:F8_E5M2FNUZ", "z:F8_E5M2FNUZ", "a:F8_E4M3FNUZ", "z:F8_E4M3FNUZ",
		"a:F8_E8M0", "z:F8_E8M0", "a:F8_E4M3", "z:F8_E4M3", "a:F8_E5M2", "z:F8_E5M2", "a:I8", "z:I8",
		"a:U8", "z:U8", "a:F6_E3M2", "z:F6_E3M2", "a:F6_E2M3", "z:F6_E2M3", "a:F4", "z:F4", "a:BOOL", "z:BOOL"}, got)
	for _, d := range refOrder {
		assert.True(t, d.Known(), d)
	}
	assert.Len(t, refRank, len(refOrder), "each dtype ranked once")
}
