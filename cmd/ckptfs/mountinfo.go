package main

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/moby/sys/mountinfo"
)

// ckptfsType is the filesystem type of a ckptfs mount in mountinfo.
const ckptfsType = "fuse.ckptfs"

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	id, parent int
	dev        string // major:minor; a FUSE mount's minor names its connection
	point      string
	fstype     string
	source     string
}

// readMountinfo reads /proc/self/mountinfo.
func readMountinfo() ([]mountEntry, error) {
	infos, err := mountinfo.GetMounts(nil)
	if err != nil {
		return nil, err
	}
	entries := make([]mountEntry, len(infos))
	for i, m := range infos {
		entries[i] = mountEntry{id: m.ID, parent: m.Parent, dev: fmt.Sprintf("%d:%d", m.Major, m.Minor),
			point: m.Mountpoint, fstype: m.FSType, source: m.Source}
	}
	return entries, nil
}

// topMount returns the mount a path lookup of point reaches: of the mounts
// at point, the one no other is stacked on.
func topMount(entries []mountEntry, point string) (mountEntry, bool) {
	var at []mountEntry
	for _, e := range entries {
		if e.point == point {
			at = append(at, e)
		}
	}
	for _, e := range at {
		covered := false
		for _, o := range at {
			covered = covered || o.parent == e.id && o.id != e.id
		}
		if !covered {
			return e, true
		}
	}
	return mountEntry{}, false
}

// absMountpoint is mnt as mountinfo names it: absolute and clean (symlinks
// are not resolved: that would stat a mount that may not answer).
func absMountpoint(mnt string) string {
	if abs, err := filepath.Abs(mnt); err == nil {
		return abs
	}
	return mnt
}

// findCkptfsMount returns the ckptfs mount a path lookup of mnt reaches, or
// an error worded as umount(8) words it.
func findCkptfsMount(mnt string) (mountEntry, error) {
	entries, err := readMountinfo()
	if err != nil {
		return mountEntry{}, err
	}
	e, ok := topMount(entries, absMountpoint(mnt))
	if !ok {
		// A path through a symlink: resolved only now, since that stats
		// the mount, which may not answer.
		if real, err := filepath.EvalSymlinks(mnt); err == nil {
			e, ok = topMount(entries, real)
		}
	}
	if !ok {
		return e, fmt.Errorf("%s: not mounted", mnt)
	}
	if e.fstype != ckptfsType {
		return e, fmt.Errorf("%s: not a ckptfs mount (%s)", mnt, e.fstype)
	}
	return e, nil
}

// findOwnMount finds the mount this process has just made at mnt. The
// kernel hands out mountinfo a page at a time, and an entry can be missed
// while other mounts come and go between the pages (seen under the tests'
// concurrent mounts): not finding a mount known to be there is asked again
// for a while before it is an error.
func findOwnMount(mnt string) (mountEntry, error) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		e, err := findCkptfsMount(mnt)
		if err == nil || time.Now().After(deadline) {
			return e, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
