package main

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProfileEnv: $CKPTFS_CPUPROFILE and $CKPTFS_MEMPROFILE make a command
// write its CPU and allocation profiles (pprof's gzipped protobuf) at exit.
func TestProfileEnv(t *testing.T) {
	defer func(r int) { runtime.MemProfileRate = r }(runtime.MemProfileRate)
	dir := t.TempDir()
	cpu, mem := filepath.Join(dir, "cpu"), filepath.Join(dir, "mem")
	t.Setenv("CKPTFS_CPUPROFILE", cpu)
	t.Setenv("CKPTFS_MEMPROFILE", mem)
	code, _, errs := runCLI("inspect", "--json", filepath.Join("..", "..", "testdata", "nested_optim", "ckpt"))
	require.Equal(t, 0, code, errs)
	for _, p := range []string{cpu, mem} {
		f, err := os.Open(p)
		require.NoError(t, err)
		z, err := gzip.NewReader(f)
		require.NoError(t, err, p)
		b, err := io.ReadAll(z)
		require.NoError(t, err, p)
		require.NotEmpty(t, b, p)
		f.Close()
	}
}
