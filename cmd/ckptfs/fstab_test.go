package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
)

// TestMountSourceIsAsGiven: mountinfo names a mount's source as the user
// wrote it, the type says it is ckptfs (issue 23: it was "ckptfs:ABS").
func TestMountSourceIsAsGiven(t *testing.T) {
	mnt, unmount := mountSampleAt(t, t.TempDir(), "--cache-size", "16MiB")
	e, err := findCkptfsMount(mnt)
	require.NoError(t, err)
	require.Equal(t, sample, e.source)
	unmount()
}

// TestMountAllMountsOnce: mount -a over an fstab line of ckptfs, run three
// times, leaves one mount: libmount finds the line mounted by its source,
// type and mount point (issue 23: each run stacked another mount).
//
// As in e2e/test_system_mount.py: mount.fuse3 runs `ckptfs SRC MNT -o
// OPTS` from sh's default PATH, so a private mount namespace shows a
// directory holding a `ckptfs` link to this test binary (TestMain runs it
// as the command) at /usr/local/sbin.
func TestMountAllMountsOnce(t *testing.T) {
	testenv.RequireSystem(t, os.Getuid() == 0, "root (mount(8) and a mount namespace)")
	for _, tool := range []string{"unshare", "mount", "umount"} {
		_, err := exec.LookPath(tool)
		testenv.RequireSystem(t, err == nil, tool+" (util-linux)")
	}
	_, err := os.Stat("/sbin/mount.fuse3")
	testenv.RequireSystem(t, err == nil, "fuse3's /sbin/mount.fuse3")
	exe, err := os.Executable()
	require.NoError(t, err)
	tmp := t.TempDir()
	bin, mnt := filepath.Join(tmp, "sbin"), filepath.Join(tmp, "mnt")
	require.NoError(t, os.Mkdir(bin, 0o755))
	require.NoError(t, os.Mkdir(mnt, 0o755))
	require.NoError(t, os.Symlink(exe, filepath.Join(bin, "ckptfs")))
	src, err := filepath.Abs(sample)
	require.NoError(t, err)
	fstab, logFile := filepath.Join(tmp, "fstab"), filepath.Join(tmp, "ckptfs.log")
	require.NoError(t, os.WriteFile(fstab, []byte(src+" "+mnt+" fuse.ckptfs ro,nofail,cache_size=16MiB,log_file="+logFile+" 0 0\n"), 0o644))

	// Three mount -a, then the mounts at mnt, then unmount them all (the
	// namespace ends with the last process in it: the mount's).
	script := `set -e
mount --bind "$1" /usr/local/sbin
for i in 1 2 3; do mount -a -T "$2"; done
echo MOUNTINFO; cat /proc/self/mountinfo
while umount "$3" 2>/dev/null; do :; done`
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", script, "sh", bin, fstab, mnt).CombinedOutput()
	log, _ := os.ReadFile(logFile)
	require.NoError(t, err, "%s\nlog:\n%s", out, log)
	_, mountinfo, ok := strings.Cut(string(out), "MOUNTINFO\n")
	require.True(t, ok, "%s", out)
	var mounts []string
	for _, line := range strings.Split(mountinfo, "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == mnt {
			mounts = append(mounts, line)
		}
	}
	require.Len(t, mounts, 1, "%s\nlog:\n%s", strings.Join(mounts, "\n"), log)
	require.Contains(t, mounts[0], " - fuse.ckptfs "+src+" ")
}
