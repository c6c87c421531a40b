package source

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// An HF hub cache (huggingface_hub's file_download.py and
// utils/_cache_manager.py) holds one folder per repo,
// <cache>/<type>s--<org>--<name>/, with
//
//	blobs/<etag>                  the files' bytes (sha256, or git sha1)
//	refs/<revision>               the commit a branch or tag resolved to
//	snapshots/<commit>/<file>     -> ../../blobs/<etag>, relative links
//
// A snapshot directory is what from_pretrained resolves to, but as a tree
// of its own every file in it is a link that leaves it. OpenHub recognises
// a snapshot by that structure and confines it to its repo folder instead:
// the links into the repo's blobs/ work, links that leave the repo folder
// (another repo's blobs, absolute paths elsewhere, ".." beyond) are
// refused as anywhere else.

// hubRepoPrefixes are the repo folders' name prefixes ("models--org--name").
var hubRepoPrefixes = []string{"models--", "datasets--", "spaces--"}

// IsHubRepoName reports whether name is the name of a hub cache repo folder.
func IsHubRepoName(name string) bool {
	for _, p := range hubRepoPrefixes {
		if rest, ok := strings.CutPrefix(name, p); ok && rest != "" {
			return true
		}
	}
	return false
}

// IsCommitHash reports whether name is a full git commit hash, the name of
// every snapshot directory huggingface_hub writes.
func IsCommitHash(name string) bool {
	if len(name) != 40 {
		return false
	}
	for _, c := range name {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// HubRepo reports whether the local directory dir, its symlinks resolved,
// is a hub cache repo folder, a snapshot in one or a directory inside a
// snapshot, and returns the repo folder (resolved) and dir's name in it
// ("." for the repo folder, "snapshots/<commit>[/sub]" otherwise).
//
// The structure is checked on the resolved path, so a models--* name that
// is a symlink counts for what it leads to: a link to a real repo folder is
// that repo, a link to any other directory is not a repo (and nothing
// around it is let in). The repo folder must hold snapshots/ and blobs/ as
// directories of its own.
func HubRepo(dir string) (repo, rel string, ok bool) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", "", false
	}
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return "", "", false
	}
	isRepo := func(d string) bool {
		if !IsHubRepoName(filepath.Base(d)) {
			return false
		}
		for _, sub := range []string{"blobs", "snapshots"} {
			fi, err := os.Lstat(filepath.Join(d, sub))
			if err != nil || !fi.IsDir() {
				return false
			}
		}
		return true
	}
	if isRepo(abs) {
		return abs, ".", true
	}
	for d := abs; ; {
		parent := filepath.Dir(d)
		if parent == d {
			return "", "", false
		}
		if IsCommitHash(filepath.Base(d)) && filepath.Base(parent) == "snapshots" && isRepo(filepath.Dir(parent)) {
			repo = filepath.Dir(parent)
			r, err := filepath.Rel(repo, abs)
			if err != nil || !filepath.IsLocal(r) {
				return "", "", false
			}
			return repo, filepath.ToSlash(r), true
		}
		d = parent
	}
}

// OpenHub opens the hub cache repo folder that the local directory dir is
// (or is inside of, see HubRepo) as a tree, and returns dir's name in it.
// It returns a nil tree, and no error, when dir is not in a hub cache. The
// folder opened is checked to be the one whose structure was looked at.
func OpenHub(dir string) (*Local, string, error) {
	repo, rel, ok := HubRepo(dir)
	if !ok {
		return nil, "", nil
	}
	seen, err := os.Lstat(repo)
	if err != nil {
		return nil, "", err
	}
	t, err := OpenLocal(repo)
	if err != nil {
		return nil, "", err
	}
	now, err := t.root.Stat(".")
	if err != nil || !os.SameFile(seen, now) {
		t.Close()
		return nil, "", &fs.PathError{Op: "open", Path: repo, Err: fmt.Errorf("%w (replaced while opened)", ErrChanged)}
	}
	return t, rel, nil
}
