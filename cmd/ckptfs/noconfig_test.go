package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestInspectSaysNoConfig: inspect of a checkpoint saved without
// config.json says to pass --hf-config (issue 34.5).
func TestInspectSaysNoConfig(t *testing.T) {
	code, out, errs := runCLI("inspect", filepath.Join("..", "..", "testdata", "fsdp2_4ranks", "ckpt"))
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "warning: no config.json: pass --hf-config DIR")
	code, out, errs = runCLI("inspect", filepath.Join(sample, "ckpt"))
	require.Equal(t, 0, code, errs)
	require.NotContains(t, out, "no config.json")
}
