package layout

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/export"
	"github.com/ckptfs/ckptfs/layout/hfdir"
	"github.com/ckptfs/ckptfs/layout/view"
	"github.com/ckptfs/ckptfs/safetensors"
)

// fixtureCase is one torch-written checkpoint under testdata/ with the
// original full tensors beside it (see e2e/fixtures/README.md).
type fixtureCase struct {
	Name   string
	Dir    string
	Format string `json:"format"`
	// Views are the directories of the case that are checkpoints, each
	// showing the expected tensors (default: ckpt/ in Format).
	Views []fixtureView `json:"views"`
	Raw   []rawTensor
	// HFKeyMap renames the expected tensors to HF names where the
	// framework's own converter only renames (KempnerForge).
	HFKeyMap map[string]string `json:"hf_key_map"`
	Skipped  []struct {
		Name string `json:"name"`
	} `json:"skipped"`
}

type fixtureView struct {
	Dir    string `json:"dir"`
	Format string `json:"format"`
}

type rawTensor struct {
	Name  string  `json:"name"`
	DType string  `json:"dtype"`
	Shape []int64 `json:"shape"`
	File  string  `json:"file"`
}

func fixtureCases(t *testing.T) []fixtureCase {
	t.Helper()
	root := filepath.Join("..", "testdata")
	ents, err := os.ReadDir(root)
	require.NoError(t, err)
	var cases []fixtureCase
	for _, e := range ents {
		dir := filepath.Join(root, e.Name())
		data, err := os.ReadFile(filepath.Join(dir, "case.json"))
		if err != nil {
			continue
		}
		c := fixtureCase{Name: e.Name(), Dir: dir}
		require.NoError(t, json.Unmarshal(data, &c), e.Name())
		if len(c.Views) == 0 {
			c.Views = []fixtureView{{Dir: "ckpt", Format: c.Format}}
		}
		cases = append(cases, c)
	}
	require.GreaterOrEqual(t, len(cases), 10, "the torch-written fixtures are missing: run make fixtures")
	return cases
}

// readSafetensors returns name → (dtype, shape, bytes) of every tensor in the
// safetensors files of dir, read with this repo's strict reader.
func readSafetensors(t *testing.T, files ...string) map[string]rawTensorData {
	t.Helper()
	out := map[string]rawTensorData{}
	for _, path := range files {
		f, err := os.Open(path)
		require.NoError(t, err)
		fi, err := f.Stat()
		require.NoError(t, err)
		h, err := safetensors.ReadHeader(f, fi.Size())
		require.NoError(t, err, path)
		for _, info := range h.Tensors {
			data, err := io.ReadAll(h.Section(f, info))
			require.NoError(t, err)
			out[info.Name] = rawTensorData{info.DType, info.Shape, data}
		}
		f.Close()
	}
	return out
}

type rawTensorData struct {
	dtype safetensors.DType
	shape []int64
	data  []byte
}

// TestExportMatchesOriginals exports every fixture view twice and compares
// each tensor, byte for byte, with the original full tensors saved beside
// it: the raw view (--map none) with the framework's own tensors, and the
// default view, given the case's HF config, with the HF model's tensors
// (the originals a Megatron model was loaded from, torchtitan's own to_hf,
// KempnerForge's own renames), or the raw ones where the names already are
// HF names.
func TestExportMatchesOriginals(t *testing.T) {
	for _, fc := range fixtureCases(t) {
		for _, fv := range fc.Views {
			t.Run(fc.Name+"/"+fv.Dir+"/raw", func(t *testing.T) {
				testExport(t, fc, fv, view.Options{NoMapping: true}, fc.expected(t))
			})
			t.Run(fc.Name+"/"+fv.Dir+"/hf", func(t *testing.T) {
				opts := view.Options{}
				if _, err := os.Stat(filepath.Join(fc.Dir, "hf_config")); err == nil {
					opts.HFConfigDir = filepath.Join(fc.Dir, "hf_config")
				}
				testExport(t, fc, fv, opts, fc.expectedHF(t))
			})
		}
	}
}

// expected is the framework's own tensors under their saved names.
func (fc fixtureCase) expected(t *testing.T) map[string]rawTensorData {
	want := readSafetensors(t, filepath.Join(fc.Dir, "expected.safetensors"))
	for _, r := range fc.Raw {
		data, err := os.ReadFile(filepath.Join(fc.Dir, r.File))
		require.NoError(t, err)
		dt, ok := safetensors.FromTorch(r.DType)
		require.True(t, ok, r.DType)
		want[r.Name] = rawTensorData{dt, r.Shape, data}
	}
	return want
}

// expectedHF is the HF model's tensors.
func (fc fixtureCase) expectedHF(t *testing.T) map[string]rawTensorData {
	if _, err := os.Stat(filepath.Join(fc.Dir, "expected_hf.safetensors")); err == nil {
		return readSafetensors(t, filepath.Join(fc.Dir, "expected_hf.safetensors"))
	}
	want := fc.expected(t)
	if fc.HFKeyMap == nil {
		return want
	}
	renamed := map[string]rawTensorData{}
	for k, v := range want {
		require.Contains(t, fc.HFKeyMap, k)
		renamed[fc.HFKeyMap[k]] = v
	}
	return renamed
}

func testExport(t *testing.T, fc fixtureCase, fv fixtureView, opts view.Options, want map[string]rawTensorData) {
	c, err := Open(filepath.Join(fc.Dir, fv.Dir))
	require.NoError(t, err)
	require.Equal(t, fv.Format, string(c.Format))
	opts.MaxShardSize = 20_000 // small files: exercise the split
	v, err := view.Plan(c, opts)
	if err != nil {
		c.Close()
	}
	require.NoError(t, err)
	defer v.Close()
	out := filepath.Join(t.TempDir(), "out")
	require.NoError(t, export.Write(context.Background(), v, out, export.Options{BlockSize: 4096, Workers: 3}))

	files, err := filepath.Glob(filepath.Join(out, "*.safetensors"))
	require.NoError(t, err)
	got := readSafetensors(t, files...)
	require.Equal(t, slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(got)))
	for name, w := range want {
		g := got[name]
		require.Equal(t, w.dtype, g.dtype, name)
		require.Equal(t, w.shape, g.shape, name)
		require.True(t, bytes.Equal(w.data, g.data), "tensor %s differs", name)
	}
	var skipped []string
	for _, s := range c.Skipped {
		skipped = append(skipped, s.Name)
	}
	for _, s := range fc.Skipped {
		require.Contains(t, skipped, s.Name)
	}

	// The index names every tensor and its file.
	var index struct {
		Metadata struct {
			TotalSize int64 `json:"total_size"`
		} `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	data, err := os.ReadFile(filepath.Join(out, hfdir.SafetensorsIndex))
	if os.IsNotExist(err) && fv.Format == "hf-safetensors" {
		require.Equal(t, []string{filepath.Join(out, "model.safetensors")}, files,
			"a plain HF directory without an index holds one model.safetensors")
		return
	}
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &index))
	require.Equal(t, slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(index.WeightMap)))
	var total int64
	for _, w := range want {
		total += int64(len(w.data))
	}
	require.Equal(t, total, index.Metadata.TotalSize)
}
