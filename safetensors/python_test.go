package safetensors

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
)

// TestPythonFiles reads files written by the real Python safetensors library
// (testdata/gen_python.py) and checks that EncodeHeader, given the tensors in
// file order, reproduces the header byte for byte.
func TestPythonFiles(t *testing.T) {
	for _, tc := range []struct {
		file  string
		check func(t *testing.T, h *Header)
	}{
		{"python_numpy.safetensors", func(t *testing.T, h *Header) {
			assert.Equal(t, map[string]string{"format": "np"}, h.Metadata)
			assert.Len(t, h.Tensors, 7)
			ti, ok := h.Lookup("model.embed.weight")
			require.True(t, ok)
			assert.Equal(t, F32, ti.DType)
			assert.Equal(t, []int64{3, 4}, ti.Shape)
			assert.Equal(t, int64(48), ti.Size())
			ti, ok = h.Lookup("step")
			require.True(t, ok)
			assert.Equal(t, TensorInfo{Name: "step", DType: I64, Shape: []int64{}, Begin: ti.Begin, End: ti.Begin + 8}, ti)
			ti, ok = h.Lookup("model.layers.0.attn.bias")
			require.True(t, ok)
			assert.Equal(t, []int64{0, 4}, ti.Shape)
			assert.Zero(t, ti.Size())
			ti, ok = h.Lookup("mask")
			require.True(t, ok)
			assert.Equal(t, BOOL, ti.DType)
		}},
		{"python_raw.safetensors", func(t *testing.T, h *Header) {
			assert.Nil(t, h.Metadata)
			for name, dt := range map[string]DType{
				"bf16": BF16, "fp8": F8_E4M3, "fp8_e5m2": F8_E5M2, "c64": C64,
				"quote\"back\\slash\nnewline": I32, "ünïcødé/😀": U16, "ctrl\x01\x7f": I8,
			} {
				ti, ok := h.Lookup(name)
				require.True(t, ok, name)
				assert.Equal(t, dt, ti.DType, name)
			}
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", tc.file))
			require.NoError(t, err)
			h, err := ReadHeader(bytes.NewReader(b), int64(len(b)))
			require.NoError(t, err)
			checkHeader(t, h, b)
			tc.check(t, h)

			enc, err := EncodeHeader(h.Metadata, h.Tensors)
			require.NoError(t, err)
			assert.Equal(t, string(b[:h.DataStart]), string(enc), "EncodeHeader matches the Rust writer")
			roundTrip(t, h, b[h.DataStart:])
		})
	}
}

// TestPythonAgrees runs every golden file through the real Python loader and
// checks that it accepts exactly the files the golden table says it does:
// everything ReadHeader accepts, plus the cases where this package is
// deliberately stricter.
func TestPythonAgrees(t *testing.T) {
	py := testenv.Python(t, "safetensors")
	args := []string{filepath.Join("testdata", "check_python.py")}
	want := map[string]bool{}
	for _, g := range goldens {
		p := filepath.Join("testdata", g.file)
		args = append(args, p)
		want[p] = g.python
		if g.wantErr == "" {
			require.True(t, g.python, "%s: a file ReadHeader accepts must be accepted by Python", g.file)
		}
	}
	for _, f := range []string{"python_numpy.safetensors", "python_raw.safetensors"} {
		p := filepath.Join("testdata", f)
		args = append(args, p)
		want[p] = true
	}
	out, err := exec.Command(py, args...).Output()
	require.NoError(t, err)
	sc := bufio.NewScanner(bytes.NewReader(out))
	seen := 0
	for sc.Scan() {
		var r struct {
			File  string `json:"file"`
			OK    bool   `json:"ok"`
			Error string `json:"error"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
		assert.Equal(t, want[r.File], r.OK, "%s: Python says ok=%v %s", r.File, r.OK, r.Error)
		seen++
	}
	assert.Equal(t, len(want), seen)
}
