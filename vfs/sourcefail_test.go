package vfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
)

// failingTree is a source tree whose Stat and ReadDir fail with err while
// it is set, and block while blocked is open.
type failingTree struct {
	source.Tree
	mu      sync.Mutex
	err     error         // GUARDED_BY(mu)
	blocked chan struct{} // GUARDED_BY(mu)
}

func (t *failingTree) set(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.err = err
}

// block makes Stat and ReadDir wait until the returned release is called.
func (t *failingTree) block() (release func()) {
	c := make(chan struct{})
	t.mu.Lock()
	t.blocked = c
	t.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(c) }) }
}

func (t *failingTree) failure() error {
	t.mu.Lock()
	err, blocked := t.err, t.blocked
	t.mu.Unlock()
	if blocked != nil {
		<-blocked
	}
	return err
}

func (t *failingTree) Stat(name string) (source.Info, error) {
	if err := t.failure(); err != nil {
		return source.Info{}, err
	}
	return t.Tree.Stat(name)
}

func (t *failingTree) ReadDir(name string) ([]source.Info, error) {
	if err := t.failure(); err != nil {
		return nil, err
	}
	return t.Tree.ReadDir(name)
}

// logLines reads a mount's log a batch of lines at a time.
type logLines struct {
	buf  lockedBuffer
	seen int
}

// lines returns the lines logged since the last call.
func (l *logLines) lines() []string {
	all := l.buf.String()
	s := strings.TrimSpace(all[l.seen:])
	l.seen = len(all)
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func mountFailingTree(t *testing.T) (*failingTree, *FS, *logLines, string) {
	t.Helper()
	local, err := source.OpenLocal(fixture(t, "sample"))
	require.NoError(t, err)
	t.Cleanup(func() { local.Close() })
	tree := &failingTree{Tree: local}
	logs := &logLines{}
	fsys := newFS(t, "", func(o *Options) {
		o.Tree = tree
		o.Logger = slog.New(slog.NewTextHandler(&logs.buf, nil))
	})
	fsys.tree.(*outageTree).retry = 10 * time.Millisecond
	return tree, fsys, logs, testMount(t, fsys)
}

// endOutage lets the source answer again, past the outage's retry
// interval, and checks that the end is logged.
func endOutage(t *testing.T, tree *failingTree, mnt string, logs *logLines) {
	t.Helper()
	tree.set(nil)
	time.Sleep(20 * time.Millisecond)
	// A name never looked up (the kernel asks), which the source answers
	// is not there.
	_, err := os.Stat(filepath.Join(mnt, fmt.Sprintf("back%d", time.Now().UnixNano())))
	require.True(t, errors.Is(err, syscall.ENOENT), "stat gave %v", err)
	lines := logs.lines()
	require.Len(t, lines, 1, "%q", lines)
	require.Contains(t, lines[0], "source answers again")
}

// TestSourceFailureIsNotENOENT: a source that fails (a store that does not
// answer, a local EIO or EACCES) makes lookups, attributes and listings
// fail with EIO (EACCES for a permission error), one log line each naming
// the source path and the cause, counted; a name the source does not have
// is ENOENT and logs nothing (issue 22: every stat error was a quiet
// ENOENT, so a stopped store read as "no such file").
func TestSourceFailureIsNotENOENT(t *testing.T) {
	tree, fsys, logs, mnt := mountFailingTree(t)
	fsys.errLog.mu.Lock()
	fsys.errLog.window = 0 // every case's lookup error is logged, none summed up
	fsys.errLog.mu.Unlock()
	storeDown := &fs.PathError{Op: "stat", Path: "s3://b/ckpt", Err: objstore.RequestFailed(objstore.Classified(
		errors.New("connection refused"), source.ErrUnavailable))}
	denied := &fs.PathError{Op: "stat", Path: "s3://b/ckpt", Err: objstore.RequestFailed(objstore.Classified(
		errors.New("StatusCode: 403, AccessDenied"), source.ErrDenied))}
	for i, tc := range []struct {
		err    error
		errno  syscall.Errno
		cause  string
		outage bool // the store did not answer (source.ErrUnavailable)
	}{
		{storeDown, syscall.EIO, "connection refused", true},
		{denied, syscall.EIO, "AccessDenied", false},
		{&fs.PathError{Op: "stat", Path: "/src/ckpt", Err: syscall.EIO}, syscall.EIO, "input/output error", false},
		{&fs.PathError{Op: "stat", Path: "/src/ckpt", Err: syscall.ETIMEDOUT}, syscall.EIO, "timed out", false},
		{&fs.PathError{Op: "stat", Path: "/src/ckpt", Err: syscall.EACCES}, syscall.EACCES, "permission denied", false},
	} {
		tree.set(tc.err)
		before := fsys.Stats().LookupErrors
		// A name never looked up: nothing in the kernel's caches answers.
		_, err := os.Stat(filepath.Join(mnt, fmt.Sprintf("ckpt%d", i)))
		require.True(t, errors.Is(err, tc.errno), "%v: stat gave %v", tc.err, err)
		lines := logs.lines()
		require.Len(t, lines, 1, "%v", tc.err)
		require.Contains(t, lines[0], tc.cause)
		require.Equal(t, before+1, fsys.Stats().LookupErrors)
		if !tc.outage {
			// An answer (denied) or no store's failure: logged as the
			// lookup's error; the next call asks the source again.
			require.NotContains(t, lines[0], "source failing")
			tree.set(nil)
			_, err = os.Stat(filepath.Join(mnt, "ckpt", "model.safetensors"))
			require.NoError(t, err, "right after %v", tc.err)
			require.Empty(t, logs.lines())
			continue
		}
		// The lookup first asks whether the directory is a checkpoint,
		// which fails, and stops there: the source is failing (an outage
		// of a source that is not local, logged as it begins).
		require.Contains(t, lines[0], "source failing")
		require.Contains(t, lines[0], fixture(t, "sample"))
		endOutage(t, tree, mnt, logs)
	}

	tree.set(storeDown)
	_, err := os.ReadDir(filepath.Join(mnt))
	require.True(t, errors.Is(err, syscall.EIO), "readdir gave %v", err)
	lines := logs.lines()
	require.Len(t, lines, 1)
	require.Contains(t, lines[0], "source failing")
	require.Contains(t, lines[0], "connection refused")
	endOutage(t, tree, mnt, logs)

	// Not found is an answer, whichever way the tree says it.
	for i, missing := range []error{
		&fs.PathError{Op: "stat", Path: "s3://b/x", Err: fs.ErrNotExist},
		&fs.PathError{Op: "stat", Path: "/src/x", Err: syscall.ENOENT},
		&fs.PathError{Op: "open", Path: "/src/x", Err: source.ErrEscapes},
	} {
		tree.set(missing)
		before := fsys.Stats().LookupErrors
		_, err := os.Stat(filepath.Join(mnt, fmt.Sprintf("missing%d", i)))
		require.True(t, errors.Is(err, syscall.ENOENT), "%v: stat gave %v", missing, err)
		require.Empty(t, logs.lines())
		require.Equal(t, before, fsys.Stats().LookupErrors)
	}

	tree.set(nil) // back: the same names answer
	require.Contains(t, listDir(t, mnt), "ckpt")
	_, err = os.Stat(filepath.Join(mnt, "ckpt", "model.safetensors"))
	require.NoError(t, err)
}

// TestStatsFileWithoutTheSource: the mount root and .ckptfs answer while
// every stat of the source blocks, and while it fails.
func TestStatsFileWithoutTheSource(t *testing.T) {
	tree, _, _, mnt := mountFailingTree(t)
	release := tree.block()
	t.Cleanup(release) // before the unmount
	done := make(chan error, 1)
	go func() {
		if _, err := os.Stat(mnt); err != nil {
			done <- err
			return
		}
		_, err := os.ReadFile(filepath.Join(mnt, statsName))
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		release()
		t.Fatal(".ckptfs waited on the source")
	}
	release()

	tree.set(errors.New("store down"))
	b, err := os.ReadFile(filepath.Join(mnt, statsName))
	require.NoError(t, err)
	require.Contains(t, string(b), `"lookup_errors": 0`)
	// The source does fail (a name never looked up), and .ckptfs still
	// answers, counting it.
	_, err = os.Stat(filepath.Join(mnt, "down"))
	require.True(t, errors.Is(err, syscall.EIO), "stat gave %v", err)
	b, err = os.ReadFile(filepath.Join(mnt, statsName))
	require.NoError(t, err)
	require.Contains(t, string(b), `"lookup_errors": 1`)
}

// A source call is left running on its own goroutine at an INTERRUPT, but
// no more than maxDetached at once: past that the caller waits for it.
func TestInterruptiblyBoundsDetachedCalls(t *testing.T) {
	f := &FS{log: discard, detached: make(chan struct{}, maxDetached)} // a remote source: no local tree
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // interrupted before it starts
	release := make(chan struct{})
	_, errno := interruptibly(ctx, f, func() (int, syscall.Errno) { <-release; return 1, 0 })
	require.Equal(t, syscall.EINTR, errno, "an interrupted call answers EINTR at once")
	for range maxDetached - 1 {
		interruptibly(ctx, f, func() (int, syscall.Errno) { <-release; return 1, 0 })
	}
	v, errno := interruptibly(ctx, f, func() (int, syscall.Errno) { return 2, 0 })
	require.Equal(t, syscall.Errno(0), errno, "with maxDetached calls running on, a call runs in the caller")
	require.Equal(t, 2, v)
	close(release)
	require.Eventually(t, func() bool { return len(f.detached) == 0 }, 5*time.Second, time.Millisecond)
}
