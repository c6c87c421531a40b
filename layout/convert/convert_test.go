package convert

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/internal/sttest"
	"github.com/ckptfs/ckptfs/safetensors"
)

// vectors reads testdata/vectors.safetensors: inputs and what torch 2.15's
// Tensor.to made of them on CPU (testdata/gen.py).
func vectors(t *testing.T) map[string][]byte {
	return sttest.FileTensors(t, "testdata/vectors.safetensors")
}

// every16 is every 16-bit pattern in order, little-endian.
func every16() []byte {
	b := make([]byte, 2<<16)
	for i := 0; i < 1<<16; i++ {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(i))
	}
	return b
}

func TestMatchesTorch(t *testing.T) {
	v := vectors(t)
	inputs := map[string][]byte{"f32": v["f32"], "f64": v["f64"], "bf16": every16(), "f16": every16()}
	types := map[string]safetensors.DType{"f32": safetensors.F32, "f64": safetensors.F64, "bf16": safetensors.BF16, "f16": safetensors.F16}
	for _, c := range []struct{ from, to string }{
		{"f32", "bf16"}, {"f32", "f16"}, {"bf16", "f16"}, {"f16", "f32"}, {"f16", "bf16"},
		{"f64", "f32"}, {"f64", "bf16"}, {"f64", "f16"},
	} {
		t.Run(c.from+"_to_"+c.to, func(t *testing.T) {
			src, want := inputs[c.from], v[c.from+"_to_"+c.to]
			require.NotEmpty(t, want)
			got := make([]byte, len(want))
			require.NoError(t, Convert(got, types[c.to], src, types[c.from]))
			es, os := types[c.from].Size(), types[c.to].Size()
			for i := 0; i < len(want)/os; i++ {
				if string(got[i*os:(i+1)*os]) != string(want[i*os:(i+1)*os]) {
					t.Fatalf("element %d: %x → got %x, torch %x", i, src[i*es:(i+1)*es], got[i*os:(i+1)*os], want[i*os:(i+1)*os])
				}
			}
		})
	}
}

func TestRejects(t *testing.T) {
	require.Error(t, Convert(make([]byte, 2), safetensors.BF16, make([]byte, 4), safetensors.I32))
	require.Error(t, Convert(make([]byte, 3), safetensors.BF16, make([]byte, 4), safetensors.F32))
	require.Error(t, Convert(make([]byte, 2), safetensors.BF16, make([]byte, 5), safetensors.F32))
}

func ExampleFloatToBF16() {
	fmt.Printf("%#04x %#04x %#04x\n", FloatToBF16(0x3f808000, 0xffff), FloatToBF16(0x3f818000, 0xffff), FloatToBF16(0x7fc00000, 0xffff))
	// Output: 0x3f80 0x3f82 0xffff
}
