package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/internal/testenv"
)

// Every transport serves the file's pattern, and its requests come the way
// it says: a benchmark of a transport that fell back to another would
// measure the wrong thing.
func TestTransportsServeThePattern(t *testing.T) {
	testenv.RequireSystem(t, os.Getuid() == 0, "root (mount(2) of a FUSE file system)")
	transports := []string{"dev", "clone"}
	const knob = "/sys/module/fuse/parameters/enable_uring"
	if was, err := os.ReadFile(knob); err == nil { // a kernel built with FUSE over io_uring
		require.NoError(t, os.WriteFile(knob, []byte("Y"), 0o644))
		t.Cleanup(func() { os.WriteFile(knob, was, 0o644) })
		transports = append(transports, "uring")
	}
	const size = 3<<20 + 12345 // a short last request
	want := make([]byte, size)
	for i := range want {
		want[i] = pattern(i)
	}
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			mnt := t.TempDir()
			type result struct {
				dev, ring int64
				err       error
			}
			done := make(chan result, 1)
			go func() {
				dev, ring, err := run(mnt, size, tr, 2, 4, 1<<20, false)
				done <- result{dev, ring, err}
			}()
			require.Eventually(t, func() bool {
				_, err := os.Stat(filepath.Join(mnt, "data"))
				return err == nil
			}, 10*time.Second, 10*time.Millisecond)
			// Read by another process, as a benchmark reads it: this one's
			// threads get the runtime's preemption signals, which interrupt
			// the FUSE requests of a read made here.
			got, err := exec.Command("cat", filepath.Join(mnt, "data")).Output()
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got), "the file's bytes")
			require.NoError(t, unix.Unmount(mnt, 0))
			r := <-done
			require.NoError(t, r.err)
			if tr == "uring" {
				require.NotZero(t, r.ring, "requests on the rings")
			} else {
				require.Zero(t, r.ring)
				require.NotZero(t, r.dev)
			}
		})
	}
}
