package vfs

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
)

// frozenTree is a store that stops answering while frozen: each call waits
// delay (its retry budget) and then fails.
type frozenTree struct {
	source.Tree
	delay  time.Duration
	frozen atomic.Bool
	asked  atomic.Int64 // calls that reached the store while frozen
}

func (t *frozenTree) fail(op, name string) error {
	if !t.frozen.Load() {
		return nil
	}
	t.asked.Add(1)
	time.Sleep(t.delay)
	return &fs.PathError{Op: op, Path: "s3://b/" + name, Err: objstore.RequestFailed(objstore.Classified(
		errors.New("operation error S3: HeadObject, exceeded maximum number of attempts, 2: timeout"), source.ErrUnavailable))}
}

func (t *frozenTree) Stat(name string) (source.Info, error) {
	if err := t.fail("stat", name); err != nil {
		return source.Info{}, err
	}
	return t.Tree.Stat(name)
}

func (t *frozenTree) ReadDir(name string) ([]source.Info, error) {
	if err := t.fail("readdir", name); err != nil {
		return nil, err
	}
	return t.Tree.ReadDir(name)
}

func (t *frozenTree) Open(name string) (source.File, error) {
	if err := t.fail("open", name); err != nil {
		return nil, err
	}
	return t.Tree.Open(name)
}

// timed runs fn and returns how long it took and its error.
func timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start), err
}

// TestOutageIsRemembered: during an outage of a remote source, the call
// that meets it waits out the store's budget once; every other call fails
// with EIO at once, or is the one call that asks the store again (within
// the budget); the outage logs one line as it begins and one as it ends,
// with a count (issue 34: looking a name up again during an outage waited
// out the budget again, twice over, and logged a line per call).
func TestOutageIsRemembered(t *testing.T) {
	local, err := source.OpenLocal(fixture(t, "sample"))
	require.NoError(t, err)
	t.Cleanup(func() { local.Close() })
	const delay = 600 * time.Millisecond
	tree := &frozenTree{Tree: local, delay: delay}
	logs := &logLines{}
	fsys := newFS(t, "", func(o *Options) {
		o.Tree = tree
		o.Logger = slog.New(slog.NewTextHandler(&logs.buf, nil))
	})
	const retry = 400 * time.Millisecond
	fsys.tree.(*outageTree).retry = retry
	mnt := testMount(t, fsys)
	require.Contains(t, listDir(t, mnt), "ckpt")
	logs.lines() // the root's note: the fixture's expected.safetensors is no checkpoint

	tree.frozen.Store(true)
	took, err := timed(func() error { _, err := os.Stat(filepath.Join(mnt, "new0")); return err })
	require.True(t, errors.Is(err, syscall.EIO), "stat gave %v", err)
	require.GreaterOrEqual(t, took, delay)
	require.Less(t, took, 2*delay, "the call that meets the outage waits out the budget once")
	require.EqualValues(t, 1, tree.asked.Load())
	lines := logs.lines()
	require.Len(t, lines, 1, "%q", lines)
	require.Contains(t, lines[0], "level=ERROR")
	require.Contains(t, lines[0], "source failing")
	require.Contains(t, lines[0], "exceeded maximum number of attempts")

	// The same name again, other names, a listing, a file's attributes:
	// each fails at once without asking the store.
	calls := map[string]func() error{
		"stat again":   func() error { _, err := os.Stat(filepath.Join(mnt, "new0")); return err },
		"stat another": func() error { _, err := os.Stat(filepath.Join(mnt, "new1")); return err },
		"listing":      func() error { _, err := os.ReadDir(mnt); return err },
		"a view file":  func() error { _, err := os.Stat(filepath.Join(mnt, "ckpt", "model.safetensors")); return err },
	}
	for what, call := range calls {
		took, err := timed(call)
		require.True(t, errors.Is(err, syscall.EIO), "%s gave %v", what, err)
		require.Less(t, took, delay/2, "%s waited on the store", what)
	}
	require.EqualValues(t, 1, tree.asked.Load())

	// Past the retry interval one call asks again; the calls during it fail
	// at once. The one that asks may be the kernel's or the mount's own (a
	// lookup it makes in the background) rather than this stat: then this
	// stat fails at once, and the store is still asked once.
	time.Sleep(retry)
	probe := make(chan error, 1)
	go func() {
		took, err := timed(func() error { _, err := os.Stat(filepath.Join(mnt, "new2")); return err })
		switch {
		case !errors.Is(err, syscall.EIO):
			err = fmt.Errorf("a call during the outage: %v after %v", err, took)
		case took < delay && tree.asked.Load() != 2:
			err = fmt.Errorf("failed at once after %v, but no other call asked the store again", took)
		default:
			err = nil
		}
		probe <- err
	}()
	time.Sleep(delay / 4)
	took, err = timed(func() error { _, err := os.Stat(filepath.Join(mnt, "new3")); return err })
	require.True(t, errors.Is(err, syscall.EIO), "stat gave %v", err)
	require.Less(t, took, delay/2)
	require.NoError(t, <-probe)
	require.EqualValues(t, 2, tree.asked.Load())
	require.Empty(t, logs.lines(), "an outage logs once as it begins")
	require.Positive(t, fsys.Stats().LookupErrors)

	// The store answers again: past the interval, the next call asks it,
	// and the end of the outage is logged with its count.
	// (The probe that failed last set the interval from its own end, and a
	// loaded machine may run the call first that is not this stat: it is
	// looked for until a bound well past the interval.)
	tree.frozen.Store(false)
	time.Sleep(retry)
	require.Eventually(t, func() bool {
		_, err = os.Stat(filepath.Join(mnt, "ckpt", "model.safetensors"))
		return err == nil
	}, 5*time.Second, 50*time.Millisecond, "the view once the store answers: %v", err)
	lines = logs.lines()
	require.Len(t, lines, 1, "%q", lines)
	require.Contains(t, lines[0], "source answers again")
	require.Contains(t, lines[0], "failed_calls=")
	require.NotContains(t, lines[0], "failed_calls=0 ")
}

// TestOutageDoesNotFailAViewForGood: a checkpoint whose view is first
// opened during an outage is shown once the store answers again (a view
// that fails to open stays failed, but an outage says nothing of the
// checkpoint), and its opening logs nothing besides the outage.
func TestOutageDoesNotFailAViewForGood(t *testing.T) {
	local, err := source.OpenLocal(fixture(t, "sample"))
	require.NoError(t, err)
	t.Cleanup(func() { local.Close() })
	tree := &frozenTree{Tree: local, delay: 100 * time.Millisecond}
	logs := &logLines{}
	fsys := newFS(t, "", func(o *Options) {
		o.Tree = tree
		o.Logger = slog.New(slog.NewTextHandler(&logs.buf, nil))
	})
	fsys.tree.(*outageTree).retry = 100 * time.Millisecond
	// The store stops between telling the directory is a checkpoint and
	// opening its view.
	var once atomic.Bool
	fsys.openHook = func(stage, dir string) {
		if stage == "open" && once.CompareAndSwap(false, true) {
			tree.frozen.Store(true)
		}
	}
	mnt := testMount(t, fsys)
	view := filepath.Join(mnt, "ckpt", "model.safetensors")
	_, err = os.Stat(view)
	require.True(t, errors.Is(err, syscall.EIO), "stat gave %v", err)
	lines := logs.lines()
	require.Len(t, lines, 1, "%q", lines)
	require.Contains(t, lines[0], "source failing")

	// Once the store answers, the next call past the retry interval asks
	// it again; on a loaded machine a background call may be that one, so
	// the view is looked for until a bound well past the interval.
	tree.frozen.Store(false)
	require.Eventually(t, func() bool { _, err = os.Stat(view); return err == nil }, 5*time.Second, 50*time.Millisecond,
		"the view is shown once the store answers: %v", err)
	require.NotContains(t, listDir(t, filepath.Join(mnt, "ckpt")), errorName)
}

// deniedTree is a store that denies access to the names under one prefix
// (a bucket policy, 403) and answers every other name.
type deniedTree struct {
	source.Tree
	prefix string
}

func (t *deniedTree) deny(op, name string) error {
	if !strings.HasPrefix(name, t.prefix) {
		return nil
	}
	return &fs.PathError{Op: op, Path: "s3://b/" + name, Err: objstore.RequestFailed(objstore.Classified(
		errors.New("operation error S3: HeadObject, https response error StatusCode: 403, api error AccessDenied"), source.ErrDenied))}
}

func (t *deniedTree) Stat(name string) (source.Info, error) {
	if err := t.deny("stat", name); err != nil {
		return source.Info{}, err
	}
	return t.Tree.Stat(name)
}

func (t *deniedTree) ReadDir(name string) ([]source.Info, error) {
	if err := t.deny("readdir", name); err != nil {
		return nil, err
	}
	return t.Tree.ReadDir(name)
}

// TestDeniedIsNoOutage: access denied under one prefix is the store's
// answer about that prefix, not an outage: lookups of other names go on
// asking the store right after it (issue 37: any failure that was not
// "missing" began an outage, so a 403 on one prefix failed every other
// lookup at once for a second).
func TestDeniedIsNoOutage(t *testing.T) {
	local, err := source.OpenLocal(fixture(t, "sample"))
	require.NoError(t, err)
	t.Cleanup(func() { local.Close() })
	logs := &logLines{}
	fsys := newFS(t, "", func(o *Options) {
		o.Tree = &deniedTree{Tree: local, prefix: "secret"}
		o.Logger = slog.New(slog.NewTextHandler(&logs.buf, nil))
	})
	fsys.tree.(*outageTree).retry = time.Hour // an outage would fail the rest of the test
	mnt := testMount(t, fsys)
	_, err = os.Stat(filepath.Join(mnt, "secret"))
	require.True(t, errors.Is(err, syscall.EIO), "stat of the denied prefix gave %v", err)
	_, err = os.Stat(filepath.Join(mnt, "ckpt", "model.safetensors"))
	require.NoError(t, err, "a name the store allows, right after a denial")
	_, err = os.Stat(filepath.Join(mnt, "nothing-here"))
	require.True(t, errors.Is(err, syscall.ENOENT), "a missing name, right after a denial: %v", err)
	require.NotContains(t, strings.Join(logs.lines(), "\n"), "source failing")
}
