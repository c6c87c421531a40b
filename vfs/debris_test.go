package vfs

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/layout/hfwrite"
)

// Issue 8, item 10: what a killed --rw write leaves is hidden in every mode,
// and an empty .safetensors file is not committed, by a rule that is
// written down (hfwrite's package doc, the README).

// killedWrite makes dir what a ckptfs killed during the first commit into it
// leaves: a stored sidecar, its spool, partial shard files, a
// .metadata.tmp, and no .metadata.
func killedWrite(t *testing.T, dir string) []string {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, hfwrite.SpoolDir), 0o700))
	debris := []string{filepath.Join(hfwrite.SpoolDir, "2.part"), "__0_0.distcp", "__1_0.distcp", ".metadata.tmp"}
	for _, n := range debris {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte("PK\x03\x04partial"), 0o644))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte("{}"), 0o644))
	return debris
}

func TestKilledWriteDebrisHidden(t *testing.T) {
	src := t.TempDir()
	back := filepath.Join(src, "new")
	debris := killedWrite(t, back)

	// A read-only mount shows the directory without the debris, and leaves
	// it on disk: it writes nothing.
	ro := filepath.Join(testMount(t, newFS(t, src)), "new")
	require.Equal(t, []string{"config.json"}, listDir(t, ro))
	for _, n := range []string{"__0_0.distcp", ".metadata.tmp", hfwrite.SpoolDir} {
		_, err := os.Stat(filepath.Join(ro, n))
		require.ErrorIs(t, err, os.ErrNotExist, n)
	}
	for _, n := range debris {
		_, err := os.Stat(filepath.Join(back, n))
		require.NoError(t, err, "%s removed by a read-only mount", n)
	}

	// A writable mount hides it too, and a lookup or a listing removes
	// nothing: the debris goes when the mount writes beside it (a mkdir in
	// the directory that holds it).
	mnt := testMount(t, newFS(t, src, writable(dcpwrite.Target{})))
	rw := filepath.Join(mnt, "new")
	_, err := os.Stat(filepath.Join(rw, "__1_0.distcp"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Equal(t, []string{"config.json"}, listDir(t, rw))
	for _, n := range debris {
		_, err := os.Stat(filepath.Join(back, n))
		require.NoError(t, err, "%s removed by a lookup", n)
	}
	require.NoError(t, os.Mkdir(filepath.Join(mnt, "other"), 0o755))
	require.Eventually(t, func() bool { return slices.Equal([]string{"config.json"}, listDir(t, back)) },
		5*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"config.json"}, listDir(t, rw))
}

// TestWriteEmptySafetensors: a .safetensors file closed empty (touch, `: >`)
// is not committed and does not stay in the directory. close(2) cannot
// report it, since the close of a descriptor that wrote nothing cannot be
// told from the close of a dup before the writes (`cmd > f`); a warning is
// logged and it is not counted as a failed commit.
func TestWriteEmptySafetensors(t *testing.T) {
	in, _ := hfDir(t)
	a, err := os.ReadFile(filepath.Join(in, "model-00001-of-00002.safetensors"))
	require.NoError(t, err)
	src := t.TempDir()
	var logs lockedBuffer
	fsys := newFS(t, src, writable(dcpwrite.Target{WorldSize: 2}), func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	dir := filepath.Join(testMount(t, fsys), "new")
	back := filepath.Join(src, "new")
	require.NoError(t, os.Mkdir(dir, 0o755))

	require.NoError(t, os.WriteFile(filepath.Join(dir, "empty.safetensors"), nil, 0o644), "close succeeds")
	require.Eventually(t, func() bool { return len(listDir(t, dir)) == 0 }, 5*time.Second, 10*time.Millisecond)
	_, err = os.Stat(filepath.Join(back, ".metadata"))
	require.ErrorIs(t, err, os.ErrNotExist, "nothing committed")
	require.Contains(t, logs.String(), "empty file not committed")
	require.Zero(t, fsys.Stats().CommitErrors)
	// The name goes before the spool file: its removal ends the drop.
	require.Eventually(t, func() bool { return len(spoolFiles(t, back)) == 0 }, 5*time.Second, 10*time.Millisecond)

	// The name is free: the real file commits.
	require.NoError(t, writeFile(t, filepath.Join(dir, "empty.safetensors"), a))
	require.Len(t, readTensors(t, dir), len(llamaA))

	// Written, then truncated to nothing before close: close reports it.
	f, err := os.Create(filepath.Join(dir, "b.safetensors"))
	require.NoError(t, err)
	_, err = f.Write([]byte("x"))
	require.NoError(t, err)
	require.NoError(t, f.Truncate(0))
	require.ErrorIs(t, f.Close(), syscall.EIO)
	require.Len(t, readTensors(t, dir), len(llamaA))
	require.Zero(t, fsys.Stats().CommitErrors)
}
