package hfwrite

import (
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/layout/view"
)

// Listing is what the directory shows. A name appears once: a new file
// being written shadows everything else, then the view, then what is
// stored in the directory.
type Listing struct {
	// Writing are the new files being written, by name. (A file that
	// rewrites an existing name leaves that name showing what it shows.)
	Writing []*File
	// View is the HF view of what is committed, with a reference for the
	// caller to Release; nil before the first tensor is committed. When
	// View.Err is set it cannot be shown, and Stored lists what the view
	// would show.
	View *View
	// Stored are the stored files (sidecars) the view does not show, and
	// Dirs the subdirectories, by name.
	Stored, Dirs []string
}

// Entries lists what the directory shows. With only != "", names other
// than only are not looked at (the view is listed whole, the directory is
// not read): a lookup costs one stat. The caller releases Listing.View.
func (s *Session) Entries(only string) (Listing, error) {
	var l Listing
	shown := map[string]bool{}
	s.mu.Lock()
	for name, f := range s.writing {
		if f.listed && (only == "" || name == only) {
			l.Writing = append(l.Writing, f)
			shown[name] = true
		}
	}
	s.mu.Unlock()
	slices.SortFunc(l.Writing, func(a, b *File) int { return strings.Compare(a.Name(), b.Name()) })
	l.View = s.currentView()
	if v := l.View; v != nil && v.View != nil {
		// The view lists whole: a name a new file shadows is not taken out.
		for _, vf := range v.Files {
			shown[vf.Name] = true
		}
	}
	var ents []os.DirEntry
	if only != "" {
		if fi, err := s.root.Lstat(only); err == nil {
			ents = []os.DirEntry{fs.FileInfoToDirEntry(fi)}
		}
	} else {
		var err error
		if ents, err = s.root.ReadDir("."); err != nil {
			l.View.Release()
			return Listing{}, fmt.Errorf("hfwrite: %w", err)
		}
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case shown[name] || Hidden(name):
		case e.Type().IsRegular():
			l.Stored = append(l.Stored, name)
		case e.IsDir():
			l.Dirs = append(l.Dirs, name)
		}
	}
	return l, nil
}

// currentView returns the view of what is committed, built after each
// change, with a reference for the caller; nil before the first tensor is
// committed.
func (s *Session) currentView() *View {
	s.viewMu.Lock()
	defer s.viewMu.Unlock()
	s.mu.Lock()
	gen, tensors := s.gen, s.tensors
	s.mu.Unlock()
	if tensors == 0 {
		return nil
	}
	if s.view == nil || s.view.gen != gen {
		// Built from the content at gen or later: a change meanwhile bumps
		// gen again, and the next call rebuilds.
		s.views++
		v := &View{Serial: s.views, gen: gen, refs: 1}
		v.View, v.Err = s.buildView()
		s.view.Release() // the session's reference to the outdated view
		s.view = v
	}
	s.view.mu.Lock()
	s.view.refs++ // not closed: the session holds a reference
	s.view.mu.Unlock()
	return s.view
}

// buildView plans the view of what is committed. A DCP checkpoint (what the
// session writes, unless sidecars make it another format) is built from
// the metadata the last commit wrote, not read back. A panic (a format
// reader meeting input it did not expect) is this view's error.
func (s *Session) buildView() (v *view.View, err error) {
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("hfwrite: %s: internal error building the view: %v", s.path, r)
		}
	}()
	tree := s.opts.Tree
	if tree == nil {
		local, err := source.OpenLocal(s.path)
		if err != nil {
			return nil, err
		}
		defer func() {
			if v == nil {
				local.Close()
			} else {
				v.Checkpoint.Files.Adopt(local)
			}
		}()
		tree = local
	}
	var c *ckpt.Checkpoint
	if format, ok := layout.Detect(tree); ok && format == torchdcp.Reader {
		c, err = torchdcp.OpenDecoded(tree, s.dir.Metadata(), torchdcp.Options{})
	} else {
		c, err = layout.OpenAs(format, tree)
	}
	if err != nil {
		return nil, err
	}
	if v, err = view.Plan(c, s.opts.Plan); err != nil {
		c.Close()
	}
	return v, err
}
