package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// readMountinfo parses /proc/self/mountinfo.
func readMountinfo() ([]mountEntry, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var entries []mountEntry
	for _, line := range strings.Split(string(b), "\n") {
		// ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER
		f := strings.Fields(line)
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+2 >= len(f) {
			continue
		}
		id, err1 := strconv.Atoi(f[0])
		parent, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			continue
		}
		entries = append(entries, mountEntry{id: id, parent: parent, dev: f[2], point: unescapeOctal(f[4]),
			fstype: f[sep+1], source: unescapeOctal(f[sep+2])})
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

// unescapeOctal undoes mountinfo's \ooo escapes (of spaces, tabs, ...).
func unescapeOctal(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
