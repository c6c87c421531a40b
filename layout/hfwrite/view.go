package hfwrite

import (
	"sync"

	"github.com/ckptfs/ckptfs/layout/view"
)

// View is the HF view of what a session has committed, as of one change of
// the directory. It is built once per change and stays open while it is
// referenced: by the session until a later change replaces it, and by each
// reference Session.Entries or Acquire gave out until its Release. The last
// Release closes its shard files.
type View struct {
	// View is nil when the committed checkpoint cannot be shown: Err says
	// why.
	*view.View
	Err error
	// Serial numbers the views of a session: 1 for the first one built.
	Serial uint64

	gen  uint64     // the session generation it was built at
	mu   sync.Mutex // guards refs
	refs int        // GUARDED_BY(mu); 0: closed
}

// File is the view's file name, or nil.
func (v *View) File(name string) *view.File {
	if v.View == nil {
		return nil
	}
	for _, f := range v.Files {
		if f.Name == name {
			return f
		}
	}
	return nil
}

// Acquire takes a reference to the view (a reader opening one of its
// files), or fails with ErrStale when it was closed: a later change
// replaced it and its last reader let go.
func (v *View) Acquire() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.refs == 0 {
		return ErrStale
	}
	v.refs++
	return nil
}

// Release gives a reference back. A nil View has none.
func (v *View) Release() {
	if v == nil {
		return
	}
	v.mu.Lock()
	v.refs--
	last := v.refs == 0
	v.mu.Unlock()
	if last && v.View != nil {
		v.View.Close()
	}
}
