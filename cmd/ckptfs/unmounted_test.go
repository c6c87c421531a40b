package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
)

// TestEveryEndOfTheMountIsLogged: the mount logs its end however it is
// unmounted: ckptfs umount, fusermount3 -u, umount(8), a signal (issue 34:
// only signals were logged).
func TestEveryEndOfTheMountIsLogged(t *testing.T) {
	_, err := exec.LookPath("fusermount3")
	testenv.RequireSystem(t, err == nil, "fusermount3")
	_, err = exec.LookPath("umount")
	testenv.RequireSystem(t, err == nil, "umount")
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, mnt string, p *mountProcess)
		by   string
	}{
		{"ckptfs umount", func(t *testing.T, mnt string, _ *mountProcess) {
			code, _, errs := runCLI("umount", mnt)
			require.Equal(t, 0, code, errs)
		}, "from outside"},
		{"fusermount3 -u", func(t *testing.T, mnt string, _ *mountProcess) {
			runUntilNotBusy(t, "fusermount3", "-u", mnt)
		}, "from outside"},
		{"umount", func(t *testing.T, mnt string, _ *mountProcess) {
			runUntilNotBusy(t, "umount", mnt)
		}, "from outside"},
		{"SIGTERM", func(t *testing.T, mnt string, p *mountProcess) {
			require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		}, "by=signal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "ckptfs.log")
			mnt := t.TempDir()
			p := startMount(t, "mount", "--log-file", logFile, sample, mnt)
			t.Cleanup(func() { lazyUnmount(mnt) })
			view := filepath.Join(mnt, "ckpt", "model.safetensors")
			require.Eventually(t, func() bool { _, err := os.Stat(view); return err == nil }, 30*time.Second, 10*time.Millisecond)
			tc.end(t, mnt, p)
			require.NoError(t, p.cmd.Wait())
			b, err := os.ReadFile(logFile)
			require.NoError(t, err)
			var ends []string
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "msg=unmounted ") {
					ends = append(ends, line)
				}
			}
			require.Len(t, ends, 1, "%s", b)
			require.Contains(t, ends[0], tc.by)
			require.Contains(t, ends[0], "mountpoint="+mnt)
		})
	}
}

// runUntilNotBusy runs an unmount command until the kernel does not refuse
// it as busy, for at most 20 s. go-fuse opens and closes a file of its own
// on a new mount (its poll probe) while the mount already answers, so an
// unmount right after the first lookup can meet that file open.
func runUntilNotBusy(t *testing.T, name string, args ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err == nil {
			return
		}
		if !strings.Contains(strings.ToLower(string(out)), "busy") || time.Now().After(deadline) {
			require.NoError(t, err, "%s: %s", name, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
