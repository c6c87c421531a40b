package hfwrite

// The session's operations on names that exist: remove, rename, truncate.

import (
	"fmt"
	"io/fs"
	"time"
)

// Remove removes name from the directory: a stored file, or a file being
// written (dropped: its writer's close then fails). What is committed from
// tensor files stays (ErrCommitted).
func (s *Session) Remove(name string) error {
	s.mu.Lock()
	f := s.writing[name]
	if f != nil {
		delete(s.writing, name)
	}
	s.mu.Unlock()
	if f != nil {
		f.Abort()
		if _, err := f.Done(); err != nil {
			return nil // dropped
		}
		// Committed meanwhile (its last release raced the remove): remove
		// what it stored.
	}
	if !s.isStored(name) {
		return s.notStored(name)
	}
	if err := s.root.Remove(name); err != nil {
		return err
	}
	s.bump()
	return nil
}

// isStored reports whether name is a stored file's (by its name: the file
// may not exist).
func (s *Session) isStored(name string) bool {
	k, err := KindOf(name)
	return err == nil && k == SidecarFile
}

// notStored is the error for removing or renaming name, not a stored file.
func (s *Session) notStored(name string) error {
	if s.shows(name) {
		return fmt.Errorf("%w: %s", ErrCommitted, name)
	}
	return fmt.Errorf("hfwrite: %s: %w", name, fs.ErrNotExist)
}

// Rename renames old to name within the directory, for the
// write-to-temp-then-rename pattern (see the package doc). With noReplace
// it fails (fs.ErrExist) when the directory shows name.
func (s *Session) Rename(old, name string, noReplace bool) error {
	if noReplace && s.shows(name) {
		return fmt.Errorf("hfwrite: %s: %w", name, fs.ErrExist)
	}
	if old == name {
		return nil
	}
	s.mu.Lock()
	f := s.writing[old]
	if f == nil {
		busy := s.writing[name] != nil
		s.mu.Unlock()
		if busy {
			return fmt.Errorf("%w: %s", ErrBusy, name)
		}
		return s.renameStored(old, name)
	}
	if s.writing[name] != nil {
		s.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrBusy, name)
	}
	if err := f.rename(name); err != nil {
		s.mu.Unlock()
		return err
	}
	delete(s.writing, old)
	s.writing[name] = f
	s.mu.Unlock()
	// A complete safetensors file renamed into place is committed now; a
	// file still incomplete commits at close.
	if f.Complete() {
		return f.Commit()
	}
	return nil
}

// renameStored renames the stored file old to name. A stored name is a
// plain rename; a tensor or index name commits the stored file as that kind
// of file (the write, close, then rename pattern) and removes it. Errors of
// such a commit wrap ErrCommit; the stored file then stays.
func (s *Session) renameStored(old, name string) error {
	if !s.isStored(old) {
		return s.notStored(old)
	}
	kind, err := KindOf(name)
	if err != nil {
		return err
	}
	if fi, err := s.root.Lstat(old); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("hfwrite: %s: %w", old, fs.ErrNotExist)
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	defer s.bump()
	if kind == SidecarFile {
		if err := s.root.Rename(old, name); err != nil {
			return fmt.Errorf("hfwrite: %w", err)
		}
		return s.root.Sync(".")
	}
	f, err := s.root.Open(old)
	if err != nil {
		return fmt.Errorf("hfwrite: %w", err)
	}
	defer f.Close()
	start := time.Now()
	err = commitWhole(s, f, name, kind, nil, nil)
	if err != nil {
		err = &CommitError{Name: name, Dir: s.path, Err: err}
	}
	if s.opts.OnCommit != nil {
		size := int64(-1)
		if fi, serr := f.Stat(); serr == nil {
			size = fi.Size()
		}
		s.opts.OnCommit(Report{Path: s.root.Path(name), Size: size, Started: start, Took: time.Since(start), Err: err})
	}
	if err != nil {
		return err
	}
	if err := s.root.Remove(old); err != nil {
		return fmt.Errorf("hfwrite: %s committed as %s, but not removed: %w", old, name, err)
	}
	return s.root.Sync(".")
}

// Truncate changes the size of the file being written under name, and
// returns it.
func (s *Session) Truncate(name string, size int64) (*File, error) {
	s.mu.Lock()
	f := s.writing[name]
	s.mu.Unlock()
	if f == nil {
		return nil, fmt.Errorf("%w: %s", ErrReadOnly, name)
	}
	return f, f.Truncate(size)
}

// shows reports whether the directory shows name.
func (s *Session) shows(name string) bool {
	l, err := s.Entries(name)
	if err != nil {
		return false
	}
	defer l.View.Release()
	if l.View != nil && l.View.View != nil && l.View.File(name) != nil {
		return true
	}
	return len(l.Writing)+len(l.Stored)+len(l.Dirs) > 0
}

// bump records a change of the directory's content.
func (s *Session) bump() {
	n := len(s.dir.Committed())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	s.tensors = n
}
