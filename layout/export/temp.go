package export

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/ckptfs/ckptfs/layout/source"
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

// tempPrefix returns out's parent directory and the prefix of the names of
// its temporary directories in it.
func tempPrefix(out string) (parent, prefix string) {
	parent, base := filepath.Split(filepath.Clean(out))
	if parent == "" {
		parent = "."
	}
	return parent, "." + base + ".ckptfs-tmp-"
}

// exportTemp is an export's temporary directory, locked while it exists.
type exportTemp struct {
	parent *source.Dir // out's parent
	name   string      // of the directory in parent
	dir    *source.Dir // the directory
	marker *source.Lock
}

// newExportTemp removes stale temporary directories of out and makes a new,
// locked one.
func newExportTemp(out string) (t *exportTemp, err error) {
	parentPath, prefix := tempPrefix(out)
	// A missing parent is made, as mkdir -p would.
	if err := os.MkdirAll(parentPath, 0o755); err != nil {
		return nil, err
	}
	parent, err := source.OpenDir(parentPath)
	if err != nil {
		return nil, err
	}
	t = &exportTemp{parent: parent}
	defer func() {
		if err != nil {
			t.discard()
		}
	}()
	sweepExportTemps(parent, prefix)
	if t.name, err = parent.MkdirTemp(prefix, 0o700); err != nil {
		return nil, err
	}
	if t.dir, err = parent.Sub(t.name); err != nil {
		return nil, err
	}
	// Locked before it takes its name, so that a marker is never seen
	// unlocked while its export runs.
	if t.marker, err = t.dir.CreateLocked(exportMarker+".new", 0o600); err != nil {
		return nil, err
	}
	if err = t.dir.Rename(exportMarker+".new", exportMarker); err != nil {
		return nil, err
	}
	return t, parent.Chmod(t.name, 0o755)
}

// commit renames the directory to out's name in its parent and syncs the
// parent: the marker goes first, so out never holds it, and the lock is
// kept until the rename is done.
func (t *exportTemp) commit(out string) error {
	if err := t.dir.Remove(exportMarker); err != nil {
		return err
	}
	if err := t.parent.Rename(t.name, filepath.Base(filepath.Clean(out))); err != nil {
		return err
	}
	return t.parent.Sync(".")
}

// discard removes the directory and releases the lock, after a failure.
func (t *exportTemp) discard() {
	if t.name != "" {
		t.parent.RemoveAll(t.name)
	}
	t.close()
}

// close releases the lock and the directories, after a commit.
func (t *exportTemp) close() {
	if t.marker != nil {
		t.marker.Release()
	}
	if t.dir != nil {
		t.dir.Close()
	}
	t.parent.Close()
}

// sweepExportTemps removes the temporary directories parent/prefix* that no
// running export holds. It is best effort: what cannot be checked or removed
// is left alone.
func sweepExportTemps(parent *source.Dir, prefix string) {
	ents, err := parent.ReadDir(".")
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) { // IsDir: not a symlink to one
			continue
		}
		marker := path.Join(e.Name(), exportMarker)
		if _, err := parent.Lstat(marker); errors.Is(err, fs.ErrNotExist) {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleUnmarked {
				parent.RemoveAll(e.Name())
			}
			continue
		}
		_, _ = parent.SweepStale(marker, func() error { return parent.RemoveAll(e.Name()) })
	}
}
