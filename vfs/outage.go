package vfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"
	"time"

	"github.com/ckptfs/ckptfs/layout/source"
)

// outageRetry is how long a failure of a remote source is remembered: for
// that long after a call to the store failed, the lookups, listings and
// opens of every name fail at once (EIO) without asking it, and then one
// call at a time asks it again while the others go on failing at once. It
// is the entry timeout of the names the kernel keeps (Dir.Lookup), so
// nothing the kernel would have asked again sooner is held back longer.
const outageRetry = time.Second

// outageTree is a remote source (an object store) that remembers that it
// failed. A store that stops answering makes each call wait out the retry
// budget (--read-timeout x --max-attempts); without a memory, one stat(2)
// can wait it out several times over (the kernel asks again, a lookup asks
// for several names, an interrupted call is asked again) and an outage logs
// a line per call. With one, the call that meets the outage waits it out
// once; every other call during the outage ends at once or is the one call
// that asks the store again, itself within the budget. The outage is logged
// once as it begins and once as it ends, with how many calls it failed.
//
// The memory is the store's, not a name's: a store that does not answer
// one name does not answer the next either. Only a store that did not
// answer (source.ErrUnavailable: timeouts, 5xx, connection errors, retries
// exhausted) begins an outage. A name the store says is missing, or access
// it denies (source.ErrDenied: one prefix's policy says nothing of
// another's), is an answer, and ends an outage like any other answer to
// the call that asks again.
type outageTree struct {
	source.Tree
	log   *slog.Logger
	retry time.Duration // outageRetry; tests shorten it

	mu      sync.Mutex
	down    bool      // GUARDED_BY(mu); a call failed and none has been answered since
	since   time.Time // GUARDED_BY(mu); when the outage began
	first   error     // GUARDED_BY(mu); the failure that began it
	failed  int64     // GUARDED_BY(mu); calls failed since it began
	retryAt time.Time // GUARDED_BY(mu); before it, no call asks the store
	probing bool      // GUARDED_BY(mu); a call is asking the store again
}

func newOutageTree(t source.Tree, log *slog.Logger) *outageTree {
	return &outageTree{Tree: t, log: log, retry: outageRetry}
}

// sourceFailing is a failure of the source itself, as opposed to an error
// about the checkpoint it holds: a view that meets one is not failed for
// good (FS.open).
type sourceFailing struct {
	err    error
	note   string // set on a call failed without asking the store
	outage bool   // the store did not answer: the outage's lines say it, not each call's
}

func (e *sourceFailing) Error() string {
	if e.note != "" {
		return e.note + ": " + e.err.Error()
	}
	return e.err.Error()
}

func (e *sourceFailing) Unwrap() error { return e.err }

// isSourceFailing reports whether err is the source failing (outageTree).
func isSourceFailing(err error) bool {
	var f *sourceFailing
	return errors.As(err, &f)
}

// inOutage reports whether err is a call failed by an outage, which is
// logged as it begins and ends, not per call.
func inOutage(err error) bool {
	var f *sourceFailing
	return errors.As(err, &f) && f.outage
}

func (t *outageTree) Stat(name string) (source.Info, error) {
	var info source.Info
	err := t.call("stat", name, func() (err error) { info, err = t.Tree.Stat(name); return })
	return info, err
}

func (t *outageTree) ReadDir(name string) ([]source.Info, error) {
	var ents []source.Info
	err := t.call("readdir", name, func() (err error) { ents, err = t.Tree.ReadDir(name); return })
	return ents, err
}

func (t *outageTree) Open(name string) (source.File, error) {
	var f source.File
	err := t.call("open", name, func() (err error) { f, err = t.Tree.Open(name); return })
	return f, err
}

// call runs fn against the store, unless an outage is remembered and it is
// not yet this call's turn to ask again: then it fails at once.
func (t *outageTree) call(op, name string, fn func() error) error {
	t.mu.Lock()
	probe := false
	if t.down {
		if t.probing || time.Now().Before(t.retryAt) {
			t.failed++
			note := fmt.Sprintf("not asked: the source has failed since %s", t.since.Format("15:04:05.000"))
			err := &fs.PathError{Op: op, Path: t.Path(name), Err: &sourceFailing{err: t.first, note: note, outage: true}}
			t.mu.Unlock()
			return err
		}
		t.probing, probe = true, true
	}
	t.mu.Unlock()
	err := fn()
	return t.settle(op, name, err, probe)
}

// settle records the outcome of a call that asked the store.
func (t *outageTree) settle(op, name string, err error, probe bool) error {
	failure := source.IsFailure(err) && !errors.Is(err, context.Canceled)
	down := failure && source.IsUnavailable(err)
	t.mu.Lock()
	defer t.mu.Unlock()
	if probe {
		t.probing = false
	}
	now := time.Now()
	switch {
	case down && !t.down:
		t.down, t.since, t.first, t.failed = true, now, err, 1
		t.retryAt = now.Add(t.retry)
		t.log.Error("source failing: calls fail at once until it answers again, asked again every "+t.retry.String(),
			"op", op, "path", t.Path(name), "err", err)
	case down:
		t.failed++
		if probe {
			t.retryAt = now.Add(t.retry)
		}
	case t.down && probe && !errors.Is(err, context.Canceled):
		// Only the call that asked again says the store answers: one that
		// began before the outage may have been answered from a cache (the
		// store tree's listings).
		t.log.Warn("source answers again", "failed_calls", t.failed, "outage", now.Sub(t.since).Round(time.Millisecond).String(),
			"first_err", t.first)
		t.down, t.first, t.failed = false, nil, 0
	}
	if failure {
		return &sourceFailing{err: err, outage: down}
	}
	return err
}
