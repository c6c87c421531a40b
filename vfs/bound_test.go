package vfs

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/memlimit"
	"github.com/ckptfs/ckptfs/internal/testenv"
	"github.com/ckptfs/ckptfs/vfs/viewcache"
)

// vmHWM is the process's peak RSS, and resetHWM starts it again from the
// RSS now (Linux: clear_refs 5).
func vmHWM(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// Three views of large checkpoints (128 ranks) open at once stay within the bound the
// README states: each counts under 448 bytes per chunk it shows (the
// compact index, ckpt.Chunks, a DCP chunk's source with where its bytes
// lie once read, and the chunk's box that a read of its tensor builds,
// all counted at open), the heap they hold is within it, and
// under the mount's collector policy (the Go limit alone, lowered while a
// .metadata is mapped: internal/memlimit) the process's peak RSS grows by
// no more than that limit.
func TestThreeLargeViewsWithinMemoryBound(t *testing.T) {
	const n, ranks = 3, 128
	root := t.TempDir()
	for i := range n {
		writeScaled(t, filepath.Join(root, step(i)), ranks)
	}
	fsys := newFS(t, root)
	const budget = 32 << 20
	setViewLimits(fsys, viewcache.Limits{Meta: budget})

	// The mount's policy, with a bound a little above what the views and
	// their decodes need, so that the collector works for it.
	const bound = budget + 96<<20
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	memlimit.Set(bound)
	defer memlimit.Set(0)

	base := testenv.LiveHeap()
	debug.FreeOSMemory()
	require.NoError(t, os.WriteFile("/proc/self/clear_refs", []byte("5"), 0))
	hwm0 := vmHWM(t)
	for i := range n {
		fsys.view(step(i), nil)
		st := entryStats(t, fsys, step(i))
		require.True(t, st.Open, "%v", st.Err)
	}
	peak := vmHWM(t) - hwm0
	st := fsys.views.Stats()
	require.Equal(t, n, st.Views, "all three stay open within the budget")
	require.LessOrEqual(t, st.MetadataBytes, int64(budget))
	// 65 tensors shown (16 layers of 4, the embedding), one chunk a rank.
	perChunk := st.MetadataBytes / (n * 65 * ranks)
	t.Logf("%d views count %d bytes, %d a chunk shown; peak RSS +%d MiB (Go limit %d MiB)", n, st.MetadataBytes, perChunk, peak>>20, bound>>20)
	require.LessOrEqual(t, perChunk, int64(448), "bytes counted per chunk shown")

	held := testenv.LiveHeap() - base
	require.LessOrEqual(t, held, st.MetadataBytes*5/4+(4<<20), "the views hold %d bytes of heap; they count %d", held, st.MetadataBytes)
	if !raceEnabled { // the race detector's shadow memory is RSS too
		require.LessOrEqual(t, peak, int64(bound), "peak RSS grew by %d bytes", peak)
	}
	runtime.KeepAlive(fsys)
}

// Opening a view makes several times the garbage of what it keeps (the
// metadata's decode, the view's plan). A mount collects at its limit only,
// except while it opens a view (internal/memlimit.Opening): with a bound far
// above the views, the heap the process keeps from the OS for twelve opens
// stays near what one open needs, not what they all allocated.
func TestOpeningCollectsItsGarbage(t *testing.T) {
	const n, ranks = 12, 24
	root := t.TempDir()
	for i := range n {
		writeScaled(t, filepath.Join(root, step(i)), ranks)
	}
	fsys := newFS(t, root)
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	memlimit.Set(4 << 30)
	defer memlimit.Set(0)

	var ms0, ms1 runtime.MemStats
	base := testenv.LiveHeap()
	debug.FreeOSMemory()
	runtime.ReadMemStats(&ms0)
	for i := range n {
		fsys.view(step(i), nil)
		st := entryStats(t, fsys, step(i))
		require.True(t, st.Open, "%v", st.Err)
	}
	runtime.ReadMemStats(&ms1)
	allocated := int64(ms1.TotalAlloc - ms0.TotalAlloc)
	grown := int64(ms1.HeapSys-ms1.HeapReleased) - int64(ms0.HeapSys-ms0.HeapReleased)
	held := testenv.LiveHeap() - base
	t.Logf("%d opens allocated %d MiB, hold %d MiB; the heap grew by %d MiB", n, allocated>>20, held>>20, grown>>20)
	require.Greater(t, ms1.NumGC, ms0.NumGC, "no collection while opening")
	require.Less(t, grown, allocated/2, "the opens' garbage was collected")
	runtime.KeepAlive(fsys)
}
