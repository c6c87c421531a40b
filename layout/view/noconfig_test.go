package view

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

// TestNoConfigWarns: a view with weights and no config.json warns, naming
// --hf-config, once; one with a config.json (--hf-config) does not (issue
// 34.5: from_pretrained failed with "Unrecognized model" and nothing
// pointed at --hf-config).
func TestNoConfigWarns(t *testing.T) {
	c := treetest.NewCheckpoint(t, t.TempDir(), treetest.Scalar("a", "a"))
	v, err := Plan(c, Options{})
	require.NoError(t, err)
	require.Equal(t, []string{NoConfigWarning}, v.Warnings)
	require.Contains(t, NewReport(c, v).Warnings, NoConfigWarning)
	require.Contains(t, NoConfigWarning, "no config.json: pass --hf-config DIR")

	cfg := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(cfg, "config.json"), []byte(`{}`), 0o644))
	v, err = Plan(c, Options{HFConfigDir: cfg})
	require.NoError(t, err)
	require.Empty(t, v.Warnings)
}
