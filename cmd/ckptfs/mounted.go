package main

import (
	"fmt"
	"path/filepath"
)

// checkNotMounted refuses a mount point that something is mounted on
// already (a ckptfs mount started twice, an fstab line mounted by hand),
// in rclone's words: mounting over it would stack a second mount that
// hides the first. Only mountinfo is read: the mount point is not touched
// before it is known not to be a mount (a dead one would not answer).
func checkNotMounted(mnt string) error {
	entries, err := readMountinfo()
	if err != nil {
		return nil // nothing to tell by; the mount itself will say
	}
	e, ok := topMount(entries, absMountpoint(mnt))
	if !ok {
		if real, err := filepath.EvalSymlinks(mnt); err == nil {
			e, ok = topMount(entries, real)
		}
	}
	if !ok {
		return nil
	}
	return fmt.Errorf("%s: directory already mounted (%s from %s), use --allow-non-empty to mount anyway", mnt, e.fstype, e.source)
}
