package vfs

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMountLogSaysNoConfig: the mount logs, once, that a view has no
// config.json and how to give it one (issue 34.5).
func TestMountLogSaysNoConfig(t *testing.T) {
	logs := &logLines{}
	fsys := newFS(t, fixture(t, "fsdp2_4ranks"), func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logs.buf, nil)) })
	mnt := testMount(t, fsys)
	require.NotContains(t, listDir(t, filepath.Join(mnt, "ckpt")), "config.json")
	_, err := os.Stat(filepath.Join(mnt, "ckpt", "model.safetensors"))
	require.NoError(t, err)
	lines := logs.lines()
	require.Len(t, lines, 1, "%q", lines)
	require.Contains(t, lines[0], "level=WARN")
	require.Contains(t, lines[0], "no config.json: pass --hf-config DIR")
}
