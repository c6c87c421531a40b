package safetensors

import (
	"bytes"
	"encoding/binary"
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

// FuzzParseHeaderDifferential checks the header scanner against the parser
// on encoding/json's tokenizer it replaced (refparse_test.go): on every
// input both accept with the same entries and metadata, or both refuse.
func FuzzParseHeaderDifferential(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.safetensors"))
	require.NoError(f, err)
	for _, file := range files {
		b, err := os.ReadFile(file)
		require.NoError(f, err)
		if len(b) >= 8 {
			n := min(uint64(len(b)-8), binary.LittleEndian.Uint64(b))
			f.Add(b[8 : 8+n])
		}
	}
	for _, s := range differentialSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gotErr := parseHeader(b, nil)
		want, wantErr := refParseHeader(b)
		if wantErr != nil {
			require.Error(t, gotErr, "reference refuses: %v", wantErr)
			require.ErrorIs(t, gotErr, ErrInvalidHeader)
			return
		}
		require.NoError(t, gotErr)
		require.Equal(t, want.Metadata, got.Metadata)
		require.Equal(t, want.Tensors, got.Tensors)
		for i, ti := range got.Tensors {
			require.Equal(t, i, got.index[ti.Name])
		}
		require.Len(t, got.index, len(got.Tensors))
	})
}

// differentialSeeds are hostile and odd headers beyond the golden files.
var differentialSeeds = []string{
	`{}`, `{} `, `{}  x`, `{ }`, "{\t\n\r}", `{"__metadata__":{}}`, `{"__metadata__":{"a":"\u00e9\n\"\\\/\b\f\r\t"}}`,
	`{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[1,],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[,1],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[1 2],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[1e2],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[1E+2],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[9223372036854775807],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[nul],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":null,"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}`,
	`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`,
	`{"a":{"dtype":"F\u0033\u0032","sh\u0061pe":[1],"data_offsets":[0,4]}}`,
	`{"\u005f_metadata__":{"k":"v"},"\u005f_metadata__":{}}`,
	`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{}}`,
	`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"\u0061":{}}`,
	`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}` + "\n}",
	`{"a" {"dtype":"F32"}}`, `{"a":1 "b":2}`, `{"a":}`, `{"a"}`, `{,}`, `{"a":{}}`, `{"a":[]}`, `{"a":"x"}`,
	`{"__metadata__":[]}`, `{"__metadata__":{"a":null}}`, `{"__metadata__":{"a":"b",}}`, `{"__metadata__":{"a":"\ud83d\ude00"}}`,
	`{"__metadata__":{"a":"\ud83d"}}`, `{"__metadata__":{"a":"\ude00"}}`, `{"__metadata__":{"a":"\ud83dx\ude00"}}`,
	`{"__metadata__":{"a":"\ud83d\u0041"}}`, `{"__metadata__":{"a":"\uZZZZ"}}`, `{"__metadata__":{"a":"\x"}}`,
	"{\"__metadata__\":{\"a\":\"\x01\"}}", "{\"__metadata__\":{\"a\":\"\x7f\"}}", `{"__metadata__":{"a":"b"`,
	`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}`, `{"a":{"dtype":1,"shape":[1],"data_offsets":[0,4]}}`,
	`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}} `, `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}`,
	`{"a":-}`, `{"a":-1}`, `{"a":1.}`, `{"a":1.5e}`, `{"a":tru}`, `{"a":false}`, `{"a":"\"}`,
}
