package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the generated golden files in testdata/")

// golden is one generated file in testdata/. TestGolden checks that the
// committed bytes match build() (rewrite them with go test -run TestGolden
// -update) and that ReadHeader accepts or rejects them as wanted.
type golden struct {
	file    string
	build   func() []byte
	wantErr string // substring of the error; "" means valid
	// python reports whether the real Python safetensors (0.8.0, safe_open)
	// accepts the file. It differs from wantErr == "" only where this package
	// is deliberately stricter.
	python bool
}

// pattern is n deterministic data bytes.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

// raw is a file with header length len(hdr), the header bytes as given, then
// n data bytes.
func raw(hdr string, n int) []byte {
	return rawN(uint64(len(hdr)), hdr, n)
}

// rawN is like raw with an explicit (possibly lying) header length.
func rawN(length uint64, hdr string, n int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, length)
	b = append(b, hdr...)
	return append(b, pattern(n)...)
}

// written is the file EncodeHeader and a data buffer make of
// Layout(tensors).
func written(metadata map[string]string, tensors []TensorInfo) []byte {
	tensors = Layout(tensors)
	hdr, err := EncodeHeader(metadata, tensors)
	if err != nil {
		panic(err)
	}
	h := Header{Tensors: tensors}
	return append(hdr, pattern(int(h.DataSize()))...)
}

const w24 = `"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}`

var goldens = []golden{
	// Valid files.
	{file: "valid_basic.safetensors", python: true, build: func() []byte {
		return written(map[string]string{"format": "pt"}, []TensorInfo{
			{Name: "model.w", DType: F32, Shape: []int64{2, 3}},
			{Name: "model.b", DType: BF16, Shape: []int64{3}},
			{Name: "step", DType: I64, Shape: []int64{}},
		})
	}},
	{file: "valid_scalar_zero.safetensors", python: true, build: func() []byte {
		return written(nil, []TensorInfo{
			{Name: "empty_first", DType: F32, Shape: []int64{0, 4}},
			{Name: "scalar", DType: F64, Shape: []int64{}},
			{Name: "empty_mid", DType: I8, Shape: []int64{3, 0}},
			{Name: "bytes", DType: U8, Shape: []int64{5}},
			{Name: "empty_last", DType: BOOL, Shape: []int64{0}},
		})
	}},
	{file: "valid_empty.safetensors", python: true, build: func() []byte {
		return written(nil, nil)
	}},
	{file: "valid_subbyte.safetensors", python: true, build: func() []byte {
		return written(nil, []TensorInfo{
			{Name: "fp4", DType: F4, Shape: []int64{2, 3}},
			{Name: "fp6", DType: F6_E2M3, Shape: []int64{4}},
			{Name: "e8m0", DType: F8_E8M0, Shape: []int64{2}},
		})
	}},
	// Entries out of data order, a zero-size tensor at offset 0 listed after
	// a full one, metadata last, JSON whitespace, escapes, and no padding to 8.
	{file: "valid_unordered.safetensors", python: true, build: func() []byte {
		return raw(`{ "b\u00e9\"\n" : {"shape":[2],"data_offsets":[24,32],"dtype":"F32"},`+"\n"+
			`"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}, "z":{"dtype":"I64","shape":[0],"data_offsets":[0,0]},`+
			`"\ud83d\ude00":{"dtype":"U8","shape":[],"data_offsets":[32,33]}, "__metadata__":{"k":"v","":""} }`, 33)
	}},

	// Truncation and sizes.
	{file: "truncated_prefix.safetensors", wantErr: "too short for the 8-byte header length", build: func() []byte {
		return []byte{8, 0, 0, 0, 0}
	}},
	{file: "truncated_header.safetensors", wantErr: "header length 64 runs past the end of the 38-byte file", build: func() []byte {
		return rawN(64, `{"w":{"dtype":"F32","shape":[]`, 0)
	}},
	{file: "truncated_data.safetensors", wantErr: "data buffer ends at", build: func() []byte {
		b := written(nil, []TensorInfo{{Name: "w", DType: F32, Shape: []int64{2, 3}}})
		return b[:len(b)-5]
	}},
	{file: "trailing_data.safetensors", wantErr: "data buffer ends at", build: func() []byte {
		return raw(`{`+w24+`}`, 25)
	}},
	{file: "header_too_large.safetensors", wantErr: "header length 100000001 exceeds MaxHeaderSize", build: func() []byte {
		return rawN(MaxHeaderSize+1, `{}`, 0)
	}},
	{file: "header_huge_length.safetensors", wantErr: "exceeds MaxHeaderSize", build: func() []byte {
		return rawN(1<<63+5, `{}`, 0)
	}},

	// JSON-level rules.
	{file: "not_brace.safetensors", python: true, wantErr: "does not start with '{'", build: func() []byte {
		return raw(` {`+w24+`}`, 24)
	}},
	{file: "not_object.safetensors", wantErr: "does not start with '{'", build: func() []byte {
		return raw(`[]`, 0)
	}},
	{file: "empty_header.safetensors", wantErr: "does not start with '{'", build: func() []byte {
		return raw(``, 0)
	}},
	{file: "trailing_garbage.safetensors", wantErr: "after the JSON object", build: func() []byte {
		return raw(`{`+w24+`}  x`, 24)
	}},
	{file: "trailing_nul.safetensors", wantErr: "after the JSON object", build: func() []byte {
		return raw(`{`+w24+"}\x00\x00", 24)
	}},
	{file: "trailing_newline.safetensors", python: true, wantErr: "after the JSON object", build: func() []byte {
		return raw(`{`+w24+"}\n", 24)
	}},
	{file: "second_object.safetensors", wantErr: "after the JSON object", build: func() []byte {
		return raw(`{`+w24+`}{}`, 24)
	}},
	{file: "unterminated.safetensors", wantErr: "malformed JSON", build: func() []byte {
		return raw(`{`+w24, 24)
	}},
	{file: "trailing_comma.safetensors", wantErr: "malformed JSON", build: func() []byte {
		return raw(`{`+w24+`,}`, 24)
	}},
	{file: "invalid_utf8.safetensors", wantErr: "not valid UTF-8", build: func() []byte {
		return raw("{\"\xff\":{\"dtype\""+`:"F32","shape":[2,3],"data_offsets":[0,24]}}`, 24)
	}},
	{file: "lone_surrogate.safetensors", wantErr: "unpaired UTF-16 surrogate", build: func() []byte {
		return raw(`{"\ud800":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}`, 24)
	}},
	{file: "duplicate_key.safetensors", python: true, wantErr: `duplicate key "w"`, build: func() []byte {
		return raw(`{`+w24+`,`+w24+`}`, 24)
	}},
	{file: "duplicate_metadata.safetensors", wantErr: `duplicate key "__metadata__"`, build: func() []byte {
		return raw(`{"__metadata__":{},`+w24+`,"__metadata__":{}}`, 24)
	}},
	{file: "duplicate_metadata_key.safetensors", python: true, wantErr: `__metadata__: duplicate key "a"`, build: func() []byte {
		return raw(`{"__metadata__":{"a":"1","a":"2"},`+w24+`}`, 24)
	}},
	{file: "duplicate_field.safetensors", wantErr: `tensor "w": duplicate field "dtype"`, build: func() []byte {
		return raw(`{"w":{"dtype":"F32","shape":[2,3],"dtype":"F32","data_offsets":[0,24]}}`, 24)
	}},
	{file: "unknown_field.safetensors", python: true, wantErr: `tensor "w": unknown field "strides"`, build: func() []byte {
		return raw(`{"w":{"dtype":"F32","shape":[2,3],"strides":[3,1],"data_offsets":[0,24]}}`, 24)
	}},
	{file: "missing_field.safetensors", wantErr: `tensor "w": missing field data_offsets`, build: func() []byte {
		return raw(`{"w":{"dtype":"F32","shape":[2,3]}}`, 24)
	}},
	{file: "entry_not_object.safetensors", wantErr: `tensor "w": entry is number 1, not an object`, build: func() []byte {
		return raw(`{"w":1}`, 0)
	}},
	{file: "unknown_dtype.safetensors", wantErr: `tensor "w": unknown dtype "F128"`, build: func() []byte {
		return raw(`{"w":{"dtype":"F128","shape":[2,3],"data_offsets":[0,24]}}`, 24)
	}},
	{file: "lowercase_dtype.safetensors", wantErr: `tensor "w": unknown dtype "f32"`, build: func() []byte {
		return raw(`{"w":{"dtype":"f32","shape":[2,3],"data_offsets":[0,24]}}`, 24)
	}},
	{file: "metadata_not_string.safetensors", wantErr: `__metadata__ key "a": value is number 1, not a string`, build: func() []byte {
		return raw(`{"__metadata__":{"a":1},`+w24+`}`, 24)
	}},
	{file: "metadata_nested.safetensors", wantErr: `__metadata__ key "a": value is an object, not a string`, build: func() []byte {
		return raw(`{"__metadata__":{"a":{"b":"c"}},`+w24+`}`, 24)
	}},
	{file: "metadata_null.safetensors", python: true, wantErr: `__metadata__ is null, not an object of strings`, build: func() []byte {
		return raw(`{"__metadata__":null,`+w24+`}`, 24)
	}},
	{file: "shape_negative.safetensors", wantErr: `tensor "w": shape[0] is -2, not a non-negative integer`, build: func() []byte {
		return raw(`{"w":{"dtype":"F32","shape":[-2,3],"data_offsets":[0,24]}}`, 24)
	}},
	{file: "shape_float.safetensors", wantErr: `tensor "w": shape[0] is 2.0, not a non-negative integer`, build: func() []byte {
		return raw(`{"w":{"dtype":"F32","shape":[2.0,3],"data_offsets":[0,24]}}`, 24)
	}},
	{file: "shape_string.safetensors", wantErr: `tensor "w": shape is string "2,3", not an array`, build: func() []byte {
		return raw(`{"w":{"dtype":"F32","shape":"2,3","data_offsets":[0,24]}}`, 24)
	}},
	{file: "offsets_three.safetensors", wantErr: `tensor "w": data_offsets has 3 elements, want 2`, build: func() []byte {
		return raw(`{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24,48]}}`, 24)
	}},
	{file: "offsets_huge.safetensors", wantErr: `tensor "w": data_offsets[1] is 18446744073709551615, not a non-negative integer below 2^63`, build: func() []byte {
		return raw(`{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,18446744073709551615]}}`, 24)
	}},

	// Offset and size rules.
	{file: "overlap.safetensors", wantErr: `tensor "b": data_offsets [16,40] overlap: previous data ends at 24`, build: func() []byte {
		return raw(`{`+w24+`,"b":{"dtype":"F32","shape":[6],"data_offsets":[16,40]}}`, 40)
	}},
	{file: "hole.safetensors", wantErr: `tensor "b": data_offsets [32,56] leave a hole: previous data ends at 24`, build: func() []byte {
		return raw(`{`+w24+`,"b":{"dtype":"F32","shape":[6],"data_offsets":[32,56]}}`, 56)
	}},
	{file: "hole_at_start.safetensors", wantErr: `tensor "w": data_offsets [8,32] leave a hole: previous data ends at 0`, build: func() []byte {
		return raw(`{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]}}`, 32)
	}},
	{file: "end_before_begin.safetensors", wantErr: `tensor "b": data_offsets [24,0] end before they begin`, build: func() []byte {
		return raw(`{`+w24+`,"b":{"dtype":"F32","shape":[0],"data_offsets":[24,0]}}`, 24)
	}},
	{file: "size_mismatch.safetensors", wantErr: `tensor "w": data_offsets [0,10] hold 10 bytes, shape [2,3] F32 needs 24`, build: func() []byte {
		return raw(`{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,10]}}`, 10)
	}},
	{file: "misaligned_bits.safetensors", wantErr: `tensor "w": shape [3] F4 holds 12 bits, not a whole number of bytes`, build: func() []byte {
		return raw(`{"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}`, 2)
	}},
	{file: "shape_overflow.safetensors", wantErr: `tensor "w": shape [4611686018427387904,4,0]: element count overflows int64`, build: func() []byte {
		return raw(`{"w":{"dtype":"F32","shape":[4611686018427387904,4,0],"data_offsets":[0,0]}}`, 0)
	}},
	{file: "bits_overflow.safetensors", wantErr: `tensor "w": shape [2305843009213693952] F64: bit count overflows int64`, build: func() []byte {
		return raw(`{"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}}`, 0)
	}},
}

func TestGolden(t *testing.T) {
	for _, g := range goldens {
		t.Run(strings.TrimSuffix(g.file, ".safetensors"), func(t *testing.T) {
			path := filepath.Join("testdata", g.file)
			want := g.build()
			if *update {
				require.NoError(t, os.WriteFile(path, want, 0o644))
			}
			got, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, want, got, "%s is stale; run go test -run TestGolden -update", path)

			h, err := ReadHeader(bytes.NewReader(got), int64(len(got)))
			if g.wantErr == "" {
				require.NoError(t, err)
				checkHeader(t, h, got)
				return
			}
			require.Error(t, err)
			assert.Nil(t, h)
			assert.ErrorIs(t, err, ErrInvalidHeader)
			var herr *HeaderError
			assert.ErrorAs(t, err, &herr)
			assert.Contains(t, err.Error(), g.wantErr)
			assert.True(t, strings.HasPrefix(err.Error(), "safetensors: invalid header: "), err.Error())
		})
	}
}

// checkHeader checks the invariants of an accepted header of file b.
func checkHeader(t *testing.T, h *Header, b []byte) {
	t.Helper()
	require.NoError(t, h.Validate(int64(len(b))))
	n := binary.LittleEndian.Uint64(b)
	assert.Equal(t, int64(8+n), h.DataStart)
	assert.Equal(t, int64(len(b))-h.DataStart, h.DataSize())
	for i, ti := range h.Tensors {
		if i > 0 {
			assert.Equal(t, h.Tensors[i-1].End, ti.Begin, "tensors in data order")
		}
		got, ok := h.Lookup(ti.Name)
		assert.True(t, ok)
		assert.Equal(t, ti, got)
		assert.NotNil(t, ti.Shape)
	}
	_, ok := h.Lookup("no such tensor")
	assert.False(t, ok)
}

func TestGoldenSpecifics(t *testing.T) {
	read := func(t *testing.T, file string) *Header {
		b, err := os.ReadFile(filepath.Join("testdata", file))
		require.NoError(t, err)
		h, err := ReadHeader(bytes.NewReader(b), int64(len(b)))
		require.NoError(t, err)
		return h
	}
	t.Run("basic", func(t *testing.T) {
		h := read(t, "valid_basic.safetensors")
		assert.Equal(t, map[string]string{"format": "pt"}, h.Metadata)
		assert.Equal(t, []TensorInfo{
			{Name: "model.w", DType: F32, Shape: []int64{2, 3}, Begin: 0, End: 24},
			{Name: "model.b", DType: BF16, Shape: []int64{3}, Begin: 24, End: 30},
			{Name: "step", DType: I64, Shape: []int64{}, Begin: 30, End: 38},
		}, h.Tensors)
		assert.Zero(t, h.DataStart%8)
	})
	t.Run("unordered", func(t *testing.T) {
		h := read(t, "valid_unordered.safetensors")
		assert.Equal(t, map[string]string{"k": "v", "": ""}, h.Metadata)
		assert.Equal(t, []TensorInfo{
			{Name: "z", DType: I64, Shape: []int64{0}, Begin: 0, End: 0},
			{Name: "a", DType: F32, Shape: []int64{2, 3}, Begin: 0, End: 24},
			{Name: "bé\"\n", DType: F32, Shape: []int64{2}, Begin: 24, End: 32},
			{Name: "😀", DType: U8, Shape: []int64{}, Begin: 32, End: 33},
		}, h.Tensors)
		assert.NotZero(t, h.DataStart%8, "padding to 8 is not required on read")
	})
	t.Run("empty", func(t *testing.T) {
		h := read(t, "valid_empty.safetensors")
		assert.Nil(t, h.Metadata)
		assert.Empty(t, h.Tensors)
		assert.Equal(t, int64(16), h.DataStart)
	})
	t.Run("sentinels", func(t *testing.T) {
		for file, want := range map[string]error{
			"header_too_large.safetensors":   ErrHeaderTooLarge,
			"header_huge_length.safetensors": ErrHeaderTooLarge,
			"truncated_prefix.safetensors":   io.ErrUnexpectedEOF,
			"truncated_header.safetensors":   io.ErrUnexpectedEOF,
		} {
			b, err := os.ReadFile(filepath.Join("testdata", file))
			require.NoError(t, err)
			_, err = ReadHeader(bytes.NewReader(b), int64(len(b)))
			assert.ErrorIs(t, err, want, file)
			assert.ErrorIs(t, err, ErrInvalidHeader, file)
		}
	})
	t.Run("tensor field", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join("testdata", "size_mismatch.safetensors"))
		require.NoError(t, err)
		_, err = ReadHeader(bytes.NewReader(b), int64(len(b)))
		var herr *HeaderError
		require.True(t, errors.As(err, &herr))
		assert.Equal(t, "w", herr.Tensor)
		assert.Equal(t, `safetensors: invalid header: tensor "w": data_offsets [0,10] hold 10 bytes, shape [2,3] F32 needs 24`, err.Error())
	})
}

// errReaderAt fails every read.
type errReaderAt struct{ err error }

func (r errReaderAt) ReadAt([]byte, int64) (int, error) { return 0, r.err }

func TestReadHeaderIOError(t *testing.T) {
	boom := errors.New("boom")
	_, err := ReadHeader(errReaderAt{boom}, 100)
	require.ErrorIs(t, err, boom)
	assert.NotErrorIs(t, err, ErrInvalidHeader)
	assert.Contains(t, err.Error(), "safetensors: reading header length")

	// A reader shorter than the size it claims.
	b := written(nil, []TensorInfo{{Name: "w", DType: F32, Shape: []int64{2}}})
	_, err = ReadHeader(bytes.NewReader(b[:20]), int64(len(b)))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Contains(t, err.Error(), "safetensors: reading")
}

// countingReaderAt records the furthest byte read.
type countingReaderAt struct {
	r   io.ReaderAt
	max int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.max = max(c.max, off+int64(n))
	return n, err
}

func TestReadHeaderSkipsData(t *testing.T) {
	b := written(nil, []TensorInfo{{Name: "w", DType: F32, Shape: []int64{1000}}})
	c := &countingReaderAt{r: bytes.NewReader(b)}
	h, err := ReadHeader(c, int64(len(b)))
	require.NoError(t, err)
	assert.Equal(t, h.DataStart, c.max)
}

func TestSection(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "valid_basic.safetensors"))
	require.NoError(t, err)
	r := bytes.NewReader(b)
	h, err := ReadHeader(r, int64(len(b)))
	require.NoError(t, err)
	data := pattern(int(h.DataSize()))
	for _, ti := range h.Tensors {
		got, err := io.ReadAll(h.Section(r, ti))
		require.NoError(t, err)
		assert.Equal(t, data[ti.Begin:ti.End], got, ti.Name)
	}
}

func TestLookupAfterEdit(t *testing.T) {
	b := written(nil, []TensorInfo{
		{Name: "a", DType: F32, Shape: []int64{1}},
		{Name: "b", DType: F32, Shape: []int64{1}},
	})
	h, err := ReadHeader(bytes.NewReader(b), int64(len(b)))
	require.NoError(t, err)
	h.Tensors = h.Tensors[1:] // index is stale now
	_, ok := h.Lookup("a")
	assert.False(t, ok)
	got, ok := h.Lookup("b")
	assert.True(t, ok)
	assert.Equal(t, "b", got.Name)

	var zero Header
	_, ok = zero.Lookup("a")
	assert.False(t, ok)
}

// ReadHeader reads into buffers it reuses; nothing a header returns may
// share them: a header read earlier is unchanged by the reads after it.
func TestReadHeaderKeepsNoBuffer(t *testing.T) {
	file := func(tag string) []byte {
		return written(map[string]string{"info": `{"` + tag + `": "\u00e9"}`, tag: tag},
			[]TensorInfo{{Name: tag + `"w`, DType: F32, Shape: []int64{2, 3}}, {Name: tag + "b", DType: BF16, Shape: []int64{4}}})
	}
	a := file("aaaa")
	h, err := ReadHeader(bytes.NewReader(a), int64(len(a)))
	require.NoError(t, err)
	want := &Header{Metadata: maps.Clone(h.Metadata), DataStart: h.DataStart}
	for _, ti := range h.Tensors {
		ti.Shape = slices.Clone(ti.Shape)
		want.Tensors = append(want.Tensors, ti)
	}
	for range 4 {
		b := file("bbbb")
		_, err := ReadHeader(bytes.NewReader(b), int64(len(b)))
		require.NoError(t, err)
	}
	require.Equal(t, want.Metadata, h.Metadata)
	require.Equal(t, want.Tensors, h.Tensors)
	require.Equal(t, `{"aaaa": "\u00e9"}`, h.Metadata["info"])
}
