package vfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/vfs/viewcache"
)

// evictBudget is the descriptor budget the eviction tests mount with: two
// views of fsdp2_4ranks (four shard files each).
const evictBudget = 8

// trainingRoot makes a root of n checkpoints, step_00 and on, each a copy
// of fsdp2_4ranks, and returns it with the reference export they share.
func trainingRoot(t *testing.T, n int) (root, ref string) {
	t.Helper()
	src := filepath.Join(fixture(t, "fsdp2_4ranks"), "ckpt")
	root = t.TempDir()
	for i := range n {
		require.NoError(t, os.CopyFS(filepath.Join(root, step(i)), os.DirFS(src)))
	}
	return root, exported(t, src)
}

func step(i int) string { return fmt.Sprintf("step_%02d", i) }

// openFDs counts the descriptors the test process holds.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// readDirect reads a file with O_DIRECT, so that every read reaches
// ckptfs instead of the kernel's page cache.
func readDirect(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0)
	require.NoError(t, err)
	defer f.Close()
	return readAll(t, f)
}

func readAll(t *testing.T, f *os.File) []byte {
	t.Helper()
	var out []byte
	buf := make([]byte, 1<<20)
	for off := int64(0); ; {
		n, err := f.ReadAt(buf, off)
		out = append(out, buf[:n]...)
		off += int64(n)
		if errors.Is(err, io.EOF) || (err == nil && n == 0) {
			return out
		}
		require.NoError(t, err)
	}
}

// residentViews counts the views in the LRU and checks the descriptor
// accounting against the budget.
func residentViews(t *testing.T, fsys *FS) int {
	t.Helper()
	st := fsys.views.Stats()
	require.LessOrEqual(t, st.FDs, evictBudget+4, "open views may hold at most the budget and the newest view")
	return st.Views
}

// setViewLimits gives fsys, before it serves, a view cache within l.
func setViewLimits(fsys *FS, l viewcache.Limits) {
	old := fsys.views
	fsys.views = fsys.newViews(l)
	old.Close()
}

// entryStats is what fsys's view cache says of the checkpoint in dir.
func entryStats(t *testing.T, fsys *FS, dir string) viewcache.EntryStats {
	t.Helper()
	for _, e := range fsys.views.Stats().Entries {
		if e.Dir == dir {
			return e
		}
	}
	require.Fail(t, "no view of "+dir)
	return viewcache.EntryStats{}
}

// Reading more checkpoints than the descriptor budget allows open at once,
// in turn and twice: every byte is right, and the descriptors the mount
// holds stay bounded (without eviction each view kept its four shard files
// open: 48 descriptors for 12 views).
func TestViewsEvictedWithinDescriptorBudget(t *testing.T) {
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) {
			const n = 12
			root, ref := trainingRoot(t, n)
			fsys := newFS(t, root, readMode(mode.direct))
			setViewLimits(fsys, viewcache.Limits{FDs: evictBudget})
			mnt := testMount(t, fsys)
			base := openFDs(t)
			for pass := range 2 {
				for i := range n {
					dir := filepath.Join(mnt, step(i))
					if pass == 0 {
						requireSameFiles(t, ref, dir)
					} else {
						// Past the kernel's page cache: the evicted view is
						// opened again and read.
						for _, name := range listDir(t, ref) {
							want, err := os.ReadFile(filepath.Join(ref, name))
							require.NoError(t, err)
							require.True(t, bytes.Equal(want, readDirect(t, filepath.Join(dir, name))), "%s/%s", step(i), name)
						}
					}
					require.LessOrEqual(t, openFDs(t), base+evictBudget+4, "pass %d, %s", pass, step(i))
					require.LessOrEqual(t, residentViews(t, fsys), 2)
				}
			}
			st := fsys.Stats()
			require.Len(t, st.Views, n, "evicted views are still listed")
			for _, v := range st.Views {
				require.Empty(t, v.Error)
				require.Equal(t, len(listDir(t, ref)), v.Files)
			}
			require.Zero(t, st.ReadErrors)
		})
	}
}

// A handle open across the eviction of its view keeps reading the right
// bytes: its view's files stay open until it is released, then close.
func TestHandleKeepsEvictedViewOpen(t *testing.T) {
	const n = 6
	root, ref := trainingRoot(t, n)
	want, err := os.ReadFile(filepath.Join(ref, "model.safetensors"))
	require.NoError(t, err)
	fsys := newFS(t, root, readMode(true))
	setViewLimits(fsys, viewcache.Limits{FDs: evictBudget})
	mnt := testMount(t, fsys)

	held, err := os.OpenFile(filepath.Join(mnt, step(0), "model.safetensors"), os.O_RDONLY|syscall.O_DIRECT, 0)
	require.NoError(t, err)
	defer held.Close()
	head := make([]byte, 16)
	_, err = held.ReadAt(head, 0)
	require.NoError(t, err)
	e := fsys.view(step(0), nil)
	inst, err := fsys.views.Acquire(e) // the view held opened
	require.NoError(t, err)
	inst.Unref()

	for i := 1; i < n; i++ {
		requireSameFiles(t, ref, filepath.Join(mnt, step(i)))
	}
	st := entryStats(t, fsys, step(0))
	require.True(t, st.Open && !st.Resident, "evicted from the LRU")
	require.False(t, inst.Closed(), "but not closed: a handle holds it")

	require.True(t, bytes.Equal(want, readAll(t, held)))
	held.Close()
	require.Eventually(t, inst.Closed, 5*time.Second, 10*time.Millisecond, "closed once released")
	// And opened again on demand.
	require.True(t, bytes.Equal(want, readDirect(t, filepath.Join(mnt, step(0), "model.safetensors"))))
}

// A checkpoint that changed while its view was evicted is an error when it
// is opened again, never its new bytes under the old view's cache ids and
// page cache.
func TestChangedWhileEvictedGivesEIO(t *testing.T) {
	for _, change := range []string{"rewritten", "replaced"} {
		t.Run(change, func(t *testing.T) {
			const n = 4
			root, ref := trainingRoot(t, n)
			fsys := newFS(t, root)
			setViewLimits(fsys, viewcache.Limits{FDs: evictBudget})
			mnt := testMount(t, fsys)
			path := filepath.Join(mnt, step(0), "model.safetensors")
			requireSameFiles(t, ref, filepath.Join(mnt, step(0)))
			for i := 1; i < n; i++ {
				requireSameFiles(t, ref, filepath.Join(mnt, step(i)))
			}
			// Closed once the kernel's RELEASE of its last handle, which
			// comes after close(2) returns, has arrived.
			require.Eventually(t, func() bool {
				return !entryStats(t, fsys, step(0)).Open
			}, 5*time.Second, 5*time.Millisecond, "step_00 was evicted and closed")

			shards, err := filepath.Glob(filepath.Join(root, step(0), "*.distcp"))
			require.NoError(t, err)
			for _, s := range shards {
				data, err := os.ReadFile(s)
				require.NoError(t, err)
				if change == "rewritten" {
					data[len(data)/2] ^= 0xff
				} else {
					require.NoError(t, os.Remove(s)) // same bytes, new file
				}
				require.NoError(t, os.WriteFile(s, data, 0o644))
			}
			_, err = os.Open(path)
			require.ErrorIs(t, err, syscall.EIO)
			require.Contains(t, listDir(t, filepath.Join(mnt, step(0))), errorName)
			// The others are untouched.
			requireSameFiles(t, ref, filepath.Join(mnt, step(1)))
		})
	}
}

// A panic while a directory is looked at or its view opened shows as that
// checkpoint's CKPTFS_ERROR.txt; its siblings keep serving.
func TestPanicInViewShowsError(t *testing.T) {
	for _, stage := range []string{"detect", "open"} {
		t.Run(stage, func(t *testing.T) {
			root, ref := trainingRoot(t, 2)
			fsys := newFS(t, root)
			fsys.openHook = func(at, dir string) {
				if at == stage && dir == step(1) {
					var m map[string]int
					//lint:ignore SA5000 the panic is what the test needs
					m["boom"]++ // a nil map write: the kind of bug hostile input finds
				}
			}
			mnt := testMount(t, fsys)
			require.Contains(t, listDir(t, filepath.Join(mnt, step(1))), errorName)
			msg, err := os.ReadFile(filepath.Join(mnt, step(1), errorName))
			require.NoError(t, err)
			require.Contains(t, string(msg), "internal error: assignment to entry in nil map")
			requireSameFiles(t, ref, filepath.Join(mnt, step(0)))
			for _, v := range fsys.Stats().Views {
				if v.Dir == step(1) { // a view whose open failed
					require.Contains(t, v.Error, "internal error")
				} else {
					require.Empty(t, v.Error, v.Dir)
				}
			}
		})
	}
}
