package deepspeed

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

func openUniversal(dir string) (*ckpt.Checkpoint, error) {
	return treetest.OpenLocal(dir, OpenUniversal)
}

// TestUniversalFixture: ds_to_universal's output is recognised and holds
// every parameter of param_shapes (bytes: layout's TestExportMatchesOriginals).
func TestUniversalFixture(t *testing.T) {
	dir := treetest.Testdata("deepspeed_universal_llama", "ckpt")
	require.True(t, treetest.Detect(t, UniversalReader, dir))
	require.False(t, treetest.Detect(t, Reader, dir))
	c, err := openUniversal(dir)
	require.NoError(t, err)
	defer c.Close()
	require.Len(t, c.Tensors, 21)
	require.Len(t, c.Skipped, 21*3+1)
}

// TestUniversalHostile: a universal checkpoint that disagrees with its
// param_shapes is an error naming the file and the cause.
func TestUniversalHostile(t *testing.T) {
	z := func(p ...string) string { return filepath.Join(append([]string{UniversalDir}, p...)...) }
	q, k := "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, dir string)
		err  string
	}{
		{"a directory param_shapes does not name", func(t *testing.T, dir string) {
			require.NoError(t, os.Mkdir(filepath.Join(dir, z("model.extra.weight")), 0o755))
		}, "zero/model.extra.weight: not a parameter of"},
		{"a parameter's fp32.pt missing", func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, z(q, fp32File))))
		}, q + "/fp32.pt: missing"},
		{"another parameter's fp32.pt", func(t *testing.T, dir string) {
			replace(t, filepath.Join(dir, z(k, fp32File)), filepath.Join(dir, z(q, fp32File)))
		}, `has shape [48 48], param_shapes says [24 48]`},
		{"the step as weights", func(t *testing.T, dir string) {
			replace(t, filepath.Join(dir, z(q, fp32File)), filepath.Join(dir, z(q, "step.pt")))
		}, "fp32.pt: data.pkl holds object torch._utils._rebuild_tensor_v2, not a dict"},
		{"not a zip", func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, z(q, fp32File)), []byte("junk"), 0o644))
		}, q + "/fp32.pt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.CopyFS(dir, os.DirFS(treetest.Testdata("deepspeed_universal_llama", "ckpt"))))
			tc.edit(t, dir)
			c, err := openUniversal(dir)
			if err == nil {
				c.Close()
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.err)
			assert.NotContains(t, err.Error(), "\n")
			assert.True(t, errors.Is(err, ckpt.ErrInvalid), err)
		})
	}
}

// FuzzUniversal opens the fixture with an arbitrary fp32.pt for one
// parameter and reads every tensor: errors, never a panic, a hang or an
// allocation beyond the bounds.
func FuzzUniversal(f *testing.F) {
	name := filepath.Join(UniversalDir, "model.norm.weight", fp32File)
	if b, err := os.ReadFile(treetest.Testdata("deepspeed_universal_llama", "ckpt", name)); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.CopyFS(dir, os.DirFS(treetest.Testdata("deepspeed_universal_llama", "ckpt"))); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := openUniversal(dir)
		if err != nil {
			return
		}
		defer c.Close()
		for _, tn := range c.Tensors {
			for _, ch := range tn.Chunks.All() {
				_, _ = treetest.ReadChunk(t, tn, ch)
			}
		}
	})
}
