package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
)

// mountTmpfs mounts a tmpfs at dir (root only) until the test ends.
func mountTmpfs(t *testing.T, dir string) {
	t.Helper()
	err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m")
	testenv.RequireSystem(t, err == nil, fmt.Sprintf("mounting a tmpfs (%v)", err))
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
}

// topType is the filesystem type a lookup of mnt reaches ("" if none).
func topType(t *testing.T, mnt string) string {
	t.Helper()
	entries, err := readMountinfo()
	require.NoError(t, err)
	e, _ := topMount(entries, mnt)
	return e.fstype
}

// procsWith returns the processes whose command line has every one of args.
func procsWith(args ...string) []int {
	var pids []int
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		all := len(cmdline) > 0
		for _, a := range args {
			all = all && bytes.Contains(cmdline, append([]byte(a), 0))
		}
		if all {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitWatchdogs waits until no unmount watchdog of mnt runs any more.
func waitWatchdogs(t *testing.T, mnt string) {
	t.Helper()
	require.Eventually(t, func() bool { return len(procsWith(watchdogCmd, mnt)) == 0 }, 10*time.Second, 10*time.Millisecond)
}

// TestUmountRefusesOtherFilesystems: ckptfs umount unmounts ckptfs mounts
// only (issue 23.1: it unmounted anything).
func TestUmountRefusesOtherFilesystems(t *testing.T) {
	dir := t.TempDir()
	code, _, errs := runCLI("umount", dir)
	require.Equal(t, 1, code)
	require.Equal(t, "ckptfs umount: "+dir+": not mounted\n", errs)

	mountTmpfs(t, dir)
	for _, args := range [][]string{{"umount", dir}, {"umount", "--lazy", dir}} {
		code, _, errs = runCLI(args...)
		require.Equal(t, 1, code)
		require.Equal(t, "ckptfs umount: "+dir+": not a ckptfs mount (tmpfs)\n", errs)
		require.Equal(t, "tmpfs", topType(t, dir))
	}
}

// TestUnmountLeavesTheMountBelow: unmounting a ckptfs mount stacked on a
// tmpfs leaves the tmpfs (issue 23.1: the watchdog, run after every exit,
// detached whatever was at the path next).
func TestUnmountLeavesTheMountBelow(t *testing.T) {
	mnt := t.TempDir()
	mountTmpfs(t, mnt)
	_, unmount := mountSampleAt(t, mnt, "--allow-non-empty") // over a mount
	require.Equal(t, ckptfsType, topType(t, mnt))
	unmount()
	waitWatchdogs(t, mnt)
	require.Equal(t, "tmpfs", topType(t, mnt))
}

// TestMountThroughASymlink: a mount point reached through a symlink is
// mounted, found by umount and watched as mountinfo names it.
func TestMountThroughASymlink(t *testing.T) {
	link := filepath.Join(t.TempDir(), "link")
	require.NoError(t, os.Symlink(t.TempDir(), link))
	_, unmount := mountSampleAt(t, link)
	unmount()
}

// TestWatchdogEndsACrashedMountOnly: a mount whose process is killed is
// detached by its watchdog, and the tmpfs under it stays.
func TestWatchdogEndsACrashedMountOnly(t *testing.T) {
	mnt := t.TempDir()
	mountTmpfs(t, mnt)
	t.Cleanup(func() { lazyUnmount(mnt) })
	code, _, errs := runCLI(sample, mnt, "-o", "cache_size=16MiB,nonempty") // over a mount
	require.Equal(t, 0, code, errs)
	require.Equal(t, ckptfsType, topType(t, mnt))
	var daemon []int
	for _, pid := range procsWith(mnt) {
		if len(procsWith(watchdogCmd, mnt, strconv.Itoa(pid))) > 0 {
			daemon = append(daemon, pid) // the mount its watchdog watches
		}
	}
	require.Len(t, daemon, 1)
	require.NoError(t, syscall.Kill(daemon[0], syscall.SIGKILL))
	waitWatchdogs(t, mnt)
	require.Equal(t, "tmpfs", topType(t, mnt))
}

// TestMountpointChecked: a mount point that is a file, or a directory with
// files, is refused before anything is mounted (issue 23.3: mount(2) on a
// file succeeded, and the failed mount was left dead); --allow-non-empty
// (-o nonempty) mounts over files.
func TestMountpointChecked(t *testing.T) {
	file := filepath.Join(t.TempDir(), "afile")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))
	code, _, errs := runCLI("mount", sample, file)
	require.Equal(t, 1, code)
	require.Equal(t, "ckptfs mount: mount point "+file+" is not a directory\n", errs)
	require.False(t, isMounted(t, file))

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), nil, 0o644))
	code, _, errs = runCLI("mount", sample, dir)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "ckptfs mount: mount point "+dir+" is not empty")
	require.False(t, isMounted(t, dir))

	for _, flag := range []string{"--allow-non-empty", "-o=nonempty"} {
		_, unmount := mountSampleAt(t, dir, flag)
		unmount()
		_, err := os.Stat(filepath.Join(dir, "f"))
		require.NoError(t, err)
	}
}

// TestHangupReopensTheLogFile: SIGHUP reopens --log-file (logrotate), and
// the mount goes on (issue 23.9: it unmounted).
func TestHangupReopensTheLogFile(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "ckptfs.log")
	mnt, unmount := mountSample(t, "--log-file", logFile)
	require.NoError(t, os.Rename(logFile, logFile+".1"))
	require.NoError(t, syscall.Kill(mountPids[mnt], syscall.SIGHUP))
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(logFile)
		return bytes.Contains(b, []byte("log file reopened"))
	}, 10*time.Second, 10*time.Millisecond)
	require.True(t, isMounted(t, mnt))
	_, err := os.Stat(filepath.Join(mnt, "ckpt", "model.safetensors"))
	require.NoError(t, err)
	unmount()
	old, err := os.ReadFile(logFile + ".1")
	require.NoError(t, err)
	require.Contains(t, string(old), "msg=mounting")
}
