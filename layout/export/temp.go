package export

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Export's temporary directory.
//
// Export writes into ".OUT.ckptfs-tmp-*" beside OUT and renames it into
// place at the end. An export that is killed leaves it behind, possibly
// gigabytes, so every export to OUT first removes the ones left by exports
// that are no longer running. A running export holds an exclusive flock on a
// marker file inside its directory (the kernel drops it when the process
// dies, however it dies), so a directory whose marker can be locked is stale,
// and one whose marker is locked is in use by another export to the same OUT.
// The marker is removed, lock still held, just before the rename.

// exportMarker is the lock file inside an export's temporary directory.
const exportMarker = ".ckptfs-export.lock"

// staleUnmarked is how old a temporary directory without a marker must be to
// be stale: the marker is created right after the directory, so only an
// export killed in between (or older versions, which had none) leaves one.
const staleUnmarked = time.Minute

func tempPrefix(out string) (parent, prefix string) {
	parent, base := filepath.Split(filepath.Clean(out))
	if parent == "" {
		parent = "."
	}
	return parent, "." + base + ".ckptfs-tmp-"
}

// exportTemp is an export's temporary directory, locked while it exists.
type exportTemp struct {
	dir    string
	marker *os.File // holds the flock
}

// newExportTemp removes stale temporary directories of out and makes a new,
// locked one.
func newExportTemp(out string) (*exportTemp, error) {
	parent, prefix := tempPrefix(out)
	sweepExportTemps(parent, prefix)
	dir, err := os.MkdirTemp(parent, prefix)
	if err != nil {
		return nil, err
	}
	// Locked before it takes its name, so that a marker is never seen
	// unlocked while its export runs.
	name := filepath.Join(dir, exportMarker)
	marker, err := os.OpenFile(name+".new", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		err = syscall.Flock(int(marker.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}
	if err == nil {
		err = os.Rename(name+".new", name)
	}
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		if marker != nil {
			marker.Close()
		}
		os.RemoveAll(dir)
		return nil, err
	}
	return &exportTemp{dir: dir, marker: marker}, nil
}

// commit renames the directory to out: the marker goes first, so out never
// holds it, and the lock is kept until the rename is done.
func (t *exportTemp) commit(out string) error {
	defer t.marker.Close()
	if err := os.Remove(filepath.Join(t.dir, exportMarker)); err != nil {
		return err
	}
	return os.Rename(t.dir, out)
}

// discard removes the directory and releases the lock.
func (t *exportTemp) discard() {
	os.RemoveAll(t.dir)
	t.marker.Close()
}

// sweepExportTemps removes the temporary directories parent/prefix* that no
// running export holds. It is best effort: what cannot be checked or removed
// is left alone.
func sweepExportTemps(parent, prefix string) {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) { // IsDir: not a symlink to one
			continue
		}
		dir := filepath.Join(parent, e.Name())
		if stale, err := staleExportTemp(dir); err == nil && stale {
			os.RemoveAll(dir)
		}
	}
}

// staleExportTemp reports whether no running export holds dir.
func staleExportTemp(dir string) (bool, error) {
	marker, err := os.OpenFile(filepath.Join(dir, exportMarker), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		info, err := os.Lstat(dir)
		if err != nil {
			return false, err
		}
		return time.Since(info.ModTime()) > staleUnmarked, nil
	}
	if err != nil {
		return false, err
	}
	defer marker.Close()
	if info, err := marker.Stat(); err != nil || !info.Mode().IsRegular() {
		return false, fmt.Errorf("%s is not our marker", marker.Name())
	}
	err = syscall.Flock(int(marker.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return false, nil // a running export holds it
	}
	if err != nil {
		return false, err
	}
	// Locked by us now: no export can be using it. (The lock goes with the
	// close after the removal.)
	return true, nil
}
