package vfs

import (
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
)

// errorLines are the lines of logs at level ERROR.
func errorLines(lines []string) []string {
	var out []string
	for _, l := range lines {
		if strings.Contains(l, "level=ERROR") {
			out = append(out, l)
		}
	}
	return out
}

// TestFailedReadsLogOnce: one failed read logs one error line, however
// often the kernel asks again; a checkpoint rewritten under the mount that
// many readers keep reading logs its first error and then one summary a
// window with the count, not a line per failed request (issue 34: one
// read logged three identical lines, and 32 readers of a rewritten
// checkpoint logged 17.9 MB in 14 s).
func TestFailedReadsLogOnce(t *testing.T) {
	src := copyTree(t, fixture(t, "fsdp2_4ranks"))
	logs := &logLines{}
	fsys := newFS(t, src, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logs.buf, nil)) })
	const window = 300 * time.Millisecond
	fsys.errLog.window = window
	mnt := testMount(t, fsys)
	view := filepath.Join(mnt, "ckpt", "model.safetensors")
	held, err := os.Open(view)
	require.NoError(t, err)
	defer held.Close()
	shards, err := filepath.Glob(filepath.Join(src, "ckpt", "*.distcp"))
	require.NoError(t, err)
	for _, s := range shards {
		require.NoError(t, os.Truncate(s, 100))
	}

	buf := make([]byte, 4096)
	_, err = held.ReadAt(buf, 0)
	require.ErrorIs(t, err, syscall.EIO)
	lines := logs.lines()
	require.Len(t, errorLines(lines), 1, "one failed read: %q", lines)

	// A storm of failed requests from many readers, opens and reads.
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				if f, err := os.OpenFile(view, os.O_RDONLY|syscall.O_DIRECT, 0); err == nil {
					f.ReadAt(make([]byte, 4096), int64(i)<<12)
					f.Close()
				}
				held.ReadAt(make([]byte, 4096), int64(i)<<20)
			}
		}()
	}
	wg.Wait()
	lines = logs.lines()
	require.Empty(t, errorLines(lines), "within the window: %d lines, first %q", len(lines), lines)
	time.Sleep(window + window/2)
	lines = logs.lines()
	require.Len(t, lines, 1, "one summary after the window: %q", lines)
	require.Contains(t, lines[0], "level=WARN")
	require.Contains(t, lines[0], "more errors")
	require.Contains(t, lines[0], filepath.Join(src, "ckpt"))
	// How many of the storm's requests reach the open and read paths
	// depends on the kernel's attribute cache and the machine's load.
	require.Regexp(t, `suppressed=[1-9]`, lines[0])
}

// TestLookupErrorsAreRateLimited: a lookup error of a local source that
// anyone can repeat (stat of a name in a directory the mount cannot read)
// logs one line per directory and window, then the count.
func TestLookupErrorsAreRateLimited(t *testing.T) {
	logs := &logLines{}
	fsys := newFS(t, fixture(t, "sample"), func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logs.buf, nil)) })
	fsys.errLog.window = 200 * time.Millisecond
	require.True(t, fsys.local)
	for i := range 100 {
		err := &fs.PathError{Op: "stat", Path: "x", Err: syscall.EIO}
		require.Equal(t, syscall.EIO, fsys.sourceErrno("stat", fmt.Sprintf("dir/name%d", i), err))
	}
	require.Len(t, logs.lines(), 1)
	time.Sleep(300 * time.Millisecond)
	lines := logs.lines()
	require.Len(t, lines, 1, "%q", lines)
	require.Contains(t, lines[0], "suppressed=99")
}
