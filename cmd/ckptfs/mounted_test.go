package main

import (
	"testing"

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
