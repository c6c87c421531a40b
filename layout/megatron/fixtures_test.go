package megatron

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
)

// TestRepoFixtures opens every multi-rank fixture under testdata/*/ckpt (or
// $CKPTFS_FIXTURES/*/ckpt) that is a DCP or Megatron checkpoint, reads every
// chunk, and compares each tensor with the fixture's expected.safetensors
// when it lists it (under the name less case.json's view_prefix).
func TestRepoFixtures(t *testing.T) {
	root := os.Getenv("CKPTFS_FIXTURES")
	if root == "" {
		root = filepath.Join("..", "..", "testdata")
	}
	dirs, _ := filepath.Glob(filepath.Join(root, "*", "ckpt"))
	opened := 0
	for _, dir := range dirs {
		var open func(string) (*ckpt.Checkpoint, error)
		switch {
		case Detect(dir):
			open = Open
		case torchdcp.Detect(dir):
			open = torchdcp.Open
		default:
			continue
		}
		opened++
		t.Run(filepath.Base(filepath.Dir(dir)), func(t *testing.T) {
			c, err := open(dir)
			require.NoError(t, err)
			defer c.Close()
			expected := readSafetensors(t, filepath.Join(filepath.Dir(dir), "expected.safetensors"))
			var cs struct {
				ViewPrefix string `json:"view_prefix"`
			}
			if b, err := os.ReadFile(filepath.Join(filepath.Dir(dir), "case.json")); err == nil {
				require.NoError(t, json.Unmarshal(b, &cs))
			}
			compared := 0
			for _, tn := range c.Tensors {
				got := assemble(t, tn)
				name, ok := strings.CutPrefix(tn.Name, cs.ViewPrefix)
				if !ok {
					continue
				}
				if e, ok := expected[name]; ok {
					assert.Equal(t, string(tn.DType), e.DType, tn.Name)
					assert.Equal(t, e.Shape, append([]int64{}, tn.Shape...), tn.Name)
					assert.Equal(t, e.data, got, tn.Name)
					compared++
				}
			}
			t.Logf("%s: %s, %d tensors (%d compared with expected.safetensors), %d objects, %d skipped",
				dir, c.Format, len(c.Tensors), compared, len(c.Objects), len(c.Skipped))
		})
	}
	if opened == 0 {
		t.Fatalf("no DCP fixtures under %s (make fixtures)", root)
	}
}

type stEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
	data        []byte
}

// readSafetensors is a minimal reader for the fixtures' expected files.
func readSafetensors(t *testing.T, path string) map[string]stEntry {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(b), 8)
	n := binary.LittleEndian.Uint64(b)
	require.LessOrEqual(t, n, uint64(len(b)-8))
	var hdr map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(b[8:8+n], &hdr))
	data := b[8+n:]
	out := map[string]stEntry{}
	for k, v := range hdr {
		if k == "__metadata__" {
			continue
		}
		var e stEntry
		require.NoError(t, json.Unmarshal(v, &e))
		e.data = data[e.DataOffsets[0]:e.DataOffsets[1]]
		if e.Shape == nil {
			e.Shape = []int64{}
		}
		out[k] = e
	}
	return out
}

// assemble reads every chunk and scatters it into the tensor's C-order bytes.
func assemble(t *testing.T, tn *ckpt.Tensor) []byte {
	es := int64(tn.DType.Size())
	total, err := ckpt.NumElements(tn.Shape)
	require.NoError(t, err)
	out := make([]byte, total*es)
	strides := make([]int64, len(tn.Shape))
	s := int64(1)
	for d := len(tn.Shape) - 1; d >= 0; d-- {
		strides[d] = s
		s *= tn.Shape[d]
	}
	for _, c := range tn.Chunks {
		data := read(t, &ckpt.Tensor{DType: tn.DType, Chunks: []ckpt.Chunk{c}})
		idx := make([]int64, len(c.Sizes))
		for e := int64(0); e < int64(len(data))/es; e++ {
			g := int64(0)
			for d := range idx {
				g += (c.Offsets[d] + idx[d]) * strides[d]
			}
			copy(out[g*es:(g+1)*es], data[e*es:(e+1)*es])
			for d := len(idx) - 1; d >= 0; d-- {
				if idx[d]++; idx[d] < c.Sizes[d] {
					break
				}
				idx[d] = 0
			}
		}
	}
	return out
}
