package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/stretchr/testify/require"
)

// TestAlreadyMountedIsRefused: mounting over a mount point that something
// is mounted on is refused in rclone's words, not as "not empty" (issue 34:
// that invited --allow-non-empty and a mount stacked on the first);
// --allow-non-empty mounts over it anyway.
func TestAlreadyMountedIsRefused(t *testing.T) {
	mnt, unmount := mountSample(t)
	code, _, errs := runCLI("mount", sample, mnt)
	require.Equal(t, 1, code)
	require.Equal(t, "ckptfs mount: "+mnt+": directory already mounted (fuse.ckptfs from "+sample+"), use --allow-non-empty to mount anyway\n", errs)
	unmount()
	require.False(t, isMounted(t, mnt))
}

// mountOptions returns the mount options (ro or rw, ...) of the mount at
// mnt, as /proc/self/mountinfo lists them.
func mountOptionsOf(t *testing.T, mnt string) []string {
	t.Helper()
	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(mnt))
	require.NoError(t, err)
	require.Len(t, infos, 1)
	return strings.Split(infos[0].Options, ",")
}

// TestReadOnlyMountSaysRo: a read-only mount is ro in mountinfo without
// -o ro (issue 34: it said rw); a --rw one is rw.
func TestReadOnlyMountSaysRo(t *testing.T) {
	mnt, unmount := mountSample(t)
	require.Contains(t, mountOptionsOf(t, mnt), "ro")
	unmount()

	src := t.TempDir()
	require.NoError(t, os.CopyFS(src, os.DirFS(sample)))
	mnt = t.TempDir()
	p := startMount(t, "mount", "--rw", src, mnt)
	t.Cleanup(func() { lazyUnmount(mnt) })
	require.Eventually(t, func() bool { return isMounted(t, mnt) }, 30*time.Second, 10*time.Millisecond)
	require.Contains(t, mountOptionsOf(t, mnt), "rw")
	code, _, errs := runCLI("umount", mnt)
	require.Equal(t, 0, code, errs)
	require.NoError(t, p.cmd.Wait(), p.stderr.String())
}
