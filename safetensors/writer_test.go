package safetensors

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundTrip encodes h's metadata and tensors, appends data, reads the
// result back, and checks that nothing changed.
func roundTrip(t *testing.T, h *Header, data []byte) {
	t.Helper()
	require.Equal(t, h.DataSize(), int64(len(data)))
	hdr, err := EncodeHeader(h.Metadata, h.Tensors)
	require.NoError(t, err)
	out := append(hdr, data...)

	h2, err := ReadHeader(bytes.NewReader(out), int64(len(out)))
	require.NoError(t, err)
	require.Equal(t, h.Metadata, h2.Metadata)
	require.Equal(t, h.Tensors, h2.Tensors)
	require.Zero(t, h2.DataStart%8, "EncodeHeader pads to 8")
	require.Equal(t, data, out[h2.DataStart:])
}

func TestRoundTrip(t *testing.T) {
	for name, tc := range map[string]struct {
		metadata map[string]string
		tensors  []TensorInfo
	}{
		"none":           {},
		"empty metadata": {metadata: map[string]string{}},
		"mixed": {
			metadata: map[string]string{"format": "pt", "z": "", "a": "q\"\\\n\x01<>&\u2028"},
			tensors: []TensorInfo{
				{Name: "z.last.alphabetically", DType: BF16, Shape: []int64{4, 5}},
				{Name: "empty", DType: F32, Shape: []int64{0}},
				{Name: "scalar", DType: F64, Shape: []int64{}},
				{Name: "a", DType: U8, Shape: []int64{3}},
				{Name: "fp4", DType: F4, Shape: []int64{2, 5}},
				{Name: "f6", DType: F6_E3M2, Shape: []int64{4}},
				{Name: "<html>&\"quote\"\t😀", DType: C64, Shape: []int64{1, 1, 1}},
				{Name: "", DType: BOOL, Shape: []int64{7}},
				{Name: "empty2", DType: I64, Shape: []int64{5, 0, 5}},
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			tensors := Layout(tc.tensors)
			h := &Header{Metadata: tc.metadata, Tensors: tensors}
			roundTrip(t, h, pattern(int(h.DataSize())))
		})
	}
}

func TestLayout(t *testing.T) {
	in := []TensorInfo{
		{Name: "a", DType: F32, Shape: []int64{2, 3}, Begin: 99, End: 7},
		{Name: "s", DType: I64, Shape: []int64{}},
		{Name: "z", DType: BF16, Shape: []int64{0, 8}},
		{Name: "bad", DType: "F128", Shape: []int64{2}},
		{Name: "b", DType: F4, Shape: []int64{4}},
	}
	out := Layout(in)
	assert.Equal(t, []TensorInfo{
		{Name: "a", DType: F32, Shape: []int64{2, 3}, Begin: 0, End: 24},
		{Name: "s", DType: I64, Shape: []int64{}, Begin: 24, End: 32},
		{Name: "z", DType: BF16, Shape: []int64{0, 8}, Begin: 32, End: 32},
		{Name: "bad", DType: "F128", Shape: []int64{2}, Begin: 32, End: 32},
		{Name: "b", DType: F4, Shape: []int64{4}, Begin: 32, End: 34},
	}, out)
	assert.Equal(t, int64(99), in[0].Begin, "input not modified")
	_, err := EncodeHeader(nil, out)
	assert.EqualError(t, err, `safetensors: invalid header: tensor "bad": unknown dtype "F128"`)
	assert.Empty(t, Layout(nil))
}

func TestByteSize(t *testing.T) {
	for _, tc := range []struct {
		dtype   DType
		shape   []int64
		want    int64
		wantErr string
	}{
		{F32, []int64{2, 3}, 24, ""},
		{F32, nil, 4, ""},
		{BF16, []int64{}, 2, ""},
		{F64, []int64{0}, 0, ""},
		{F4, []int64{2}, 1, ""},
		{F4, []int64{3}, 0, "holds 12 bits, not a whole number of bytes"},
		{F6_E2M3, []int64{4}, 3, ""},
		{F6_E2M3, []int64{2}, 0, "holds 12 bits"},
		{F6_E2M3, []int64{0}, 0, ""},
		{"X", []int64{1}, 0, `unknown dtype "X"`},
		{F32, []int64{-1}, 0, "negative dimension -1 at index 0"},
		{U8, []int64{math.MaxInt64 / 8}, math.MaxInt64 / 8, ""},
		{U8, []int64{math.MaxInt64/8 + 1}, 0, "bit count overflows"},
		{I16, []int64{math.MaxInt64}, 0, "bit count overflows"},
		{U8, []int64{1 << 32, 1 << 31}, 0, "element count overflows"},
		{U8, []int64{1 << 32, 1 << 32, 0}, 0, "element count overflows"}, // like Rust's checked fold
		{U8, []int64{0, 1 << 32, 1 << 32}, 0, ""},
	} {
		got, err := ByteSize(tc.dtype, tc.shape)
		if tc.wantErr != "" {
			assert.ErrorContains(t, err, tc.wantErr, "%s %v", tc.dtype, tc.shape)
			continue
		}
		assert.NoError(t, err, "%s %v", tc.dtype, tc.shape)
		assert.Equal(t, tc.want, got, "%s %v", tc.dtype, tc.shape)
	}
}

func TestEncodeHeader(t *testing.T) {
	hdr := func(json string) []byte {
		for (len(json))%8 != 0 {
			json += " "
		}
		return append(binary.LittleEndian.AppendUint64(nil, uint64(len(json))), json...)
	}
	for name, tc := range map[string]struct {
		metadata map[string]string
		tensors  []TensorInfo
		want     []byte
	}{
		// The expected bytes of the first four are the Rust crate's own tests
		// (test_empty, test_serialization, test_serialization_forced_alignement).
		"empty": {want: []byte{8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '}},
		"metadata only": {
			metadata: map[string]string{"framework": "pt"},
			want:     hdr(`{"__metadata__":{"framework":"pt"}}`),
		},
		"one": {
			tensors: []TensorInfo{{Name: "attn.0", DType: F32, Shape: []int64{1, 2, 3}, Begin: 0, End: 24}},
			want:    append([]byte{64, 0, 0, 0, 0, 0, 0, 0}, `{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`...),
		},
		"forced alignment": {
			tensors: []TensorInfo{{Name: "attn0", DType: F32, Shape: []int64{1, 1, 2, 3}, Begin: 0, End: 24}},
			want:    append([]byte{72, 0, 0, 0, 0, 0, 0, 0}, `{"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}}       `...),
		},
		"given order, sorted metadata, escapes": {
			metadata: map[string]string{"b": "2", "a": "<&>", "c\n": "\x1f\u2028"},
			tensors: Layout([]TensorInfo{
				{Name: "z", DType: F32, Shape: []int64{2, 3}},
				{Name: "a\"\\", DType: F32, Shape: []int64{}},
			}),
			want: hdr(`{"__metadata__":{"a":"<&>","b":"2","c\n":"\u001f` + "\u2028" + `"},` +
				`"z":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},` +
				`"a\"\\":{"dtype":"F32","shape":[],"data_offsets":[24,28]}}`),
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := EncodeHeader(tc.metadata, tc.tensors)
			require.NoError(t, err)
			assert.Equal(t, string(tc.want), string(got))
			assert.Zero(t, len(got)%8)
		})
	}
}

func TestEncodeHeaderErrors(t *testing.T) {
	f32 := func(name string, begin, end int64, shape ...int64) TensorInfo {
		return TensorInfo{Name: name, DType: F32, Shape: shape, Begin: begin, End: end}
	}
	for name, tc := range map[string]struct {
		metadata map[string]string
		tensors  []TensorInfo
		wantErr  string
	}{
		"not from 0":      {tensors: []TensorInfo{f32("a", 4, 8, 1)}, wantErr: `tensor "a": data_offsets [4,8] leave a hole: previous data ends at 0`},
		"hole":            {tensors: []TensorInfo{f32("a", 0, 4, 1), f32("b", 8, 12, 1)}, wantErr: `tensor "b": data_offsets [8,12] leave a hole`},
		"overlap":         {tensors: []TensorInfo{f32("a", 0, 8, 2), f32("b", 4, 8, 1)}, wantErr: `tensor "b": data_offsets [4,8] overlap`},
		"not given order": {tensors: []TensorInfo{f32("b", 4, 8, 1), f32("a", 0, 4, 1)}, wantErr: `tensor "b": data_offsets [4,8] leave a hole`},
		"negative":        {tensors: []TensorInfo{f32("a", -4, 0, 1)}, wantErr: `tensor "a": data_offsets [-4,0] are negative`},
		"size":            {tensors: []TensorInfo{f32("a", 0, 8, 3)}, wantErr: `tensor "a": data_offsets [0,8] hold 8 bytes, shape [3] F32 needs 12`},
		"dtype":           {tensors: []TensorInfo{{Name: "a", DType: "f32"}}, wantErr: `tensor "a": unknown dtype "f32"`},
		"negative dim":    {tensors: []TensorInfo{f32("a", 0, 0, 2, -1)}, wantErr: `tensor "a": shape [2,-1] has negative dimension at index 1`},
		"misaligned":      {tensors: Layout([]TensorInfo{{Name: "a", DType: F4, Shape: []int64{1}}}), wantErr: `tensor "a": shape [1] F4 holds 4 bits`},
		"duplicate":       {tensors: []TensorInfo{f32("a", 0, 4, 1), f32("a", 4, 8, 1)}, wantErr: `tensor "a": duplicate tensor name`},
		"reserved":        {tensors: []TensorInfo{f32("__metadata__", 0, 4, 1)}, wantErr: `tensor "__metadata__": name is reserved`},
		"bad utf8 name":   {tensors: []TensorInfo{f32("a\xff", 0, 4, 1)}, wantErr: `name is not valid UTF-8`},
		"bad utf8 key":    {metadata: map[string]string{"\xff": ""}, wantErr: `__metadata__ key "\xff" is not valid UTF-8`},
		"bad utf8 value":  {metadata: map[string]string{"k": "\xff"}, wantErr: `__metadata__ key "k": value is not valid UTF-8`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := EncodeHeader(tc.metadata, tc.tensors)
			require.ErrorIs(t, err, ErrInvalidHeader)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestEncodeHeaderTooLarge(t *testing.T) {
	// {"__metadata__":{"big":"…"}} is 27 bytes around the value.
	big := strings.Repeat("a", MaxHeaderSize-27)
	b, err := EncodeHeader(map[string]string{"big": big}, nil)
	require.NoError(t, err)
	require.Len(t, b, 8+MaxHeaderSize)
	_, err = EncodeHeader(map[string]string{"big": big + "a"}, nil)
	require.ErrorIs(t, err, ErrHeaderTooLarge)
	require.ErrorIs(t, err, ErrInvalidHeader)
	require.ErrorContains(t, err, "header length 100000008 exceeds MaxHeaderSize 100000000")

	// Decoding a 100 MB header takes ~15 s under the race detector; make
	// test runs this package again without it (GOMAXPROCS=1), and that
	// run checks the decode.
	if raceEnabled {
		return
	}
	h, err := ReadHeader(bytes.NewReader(b), int64(len(b)))
	require.NoError(t, err, "a header of exactly MaxHeaderSize is accepted")
	require.Equal(t, big, h.Metadata["big"])
}

func TestHeaderValidate(t *testing.T) {
	h := &Header{Tensors: Layout([]TensorInfo{{Name: "a", DType: F32, Shape: []int64{2}}}), DataStart: 72}
	assert.NoError(t, h.Validate(80))
	assert.ErrorContains(t, h.Validate(81), "data buffer ends at 80 (data start 72 + last end 8) but the file is 81 bytes")
	h.DataStart = 4
	assert.ErrorContains(t, h.Validate(12), "data start 4 is not 8 plus a header length")
	h.DataStart = 8 + MaxHeaderSize + 1
	assert.ErrorContains(t, h.Validate(8+MaxHeaderSize+9), "data start")
	h = &Header{Tensors: []TensorInfo{{Name: "a", DType: U8, Shape: []int64{}, Begin: 0, End: 1}}, DataStart: math.MaxInt64}
	assert.ErrorContains(t, h.Validate(math.MaxInt64), "data start")
}
