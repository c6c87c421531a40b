package viewcache

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/layout/view"
)

// ranks is the shard files, and so the descriptors, of each test view.
const ranks = 4

// writeDCP writes a small DCP checkpoint into dir: two tensors saved as
// {"model": ...}, each split on dim 0 into one chunk per rank, in sparse
// shard files (nothing is read from them to open or plan the view), unless
// metadataOnly. rows shapes the embedding, so that two checkpoints can
// differ in metadata alone.
func writeDCP(t *testing.T, dir string, rows int64, metadataOnly bool) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	m := &torchdcp.Metadata{Planner: []torchdcp.PlannerEntry{}}
	sizes := make([]int64, ranks)
	add := func(name string, shape []int64) {
		tm := &torchdcp.TensorMetadata{Properties: torchdcp.TensorProperties{DType: "bfloat16", Layout: "torch.strided"}, Size: shape}
		per := (shape[0] + ranks - 1) / ranks
		row := int64(2)
		for _, d := range shape[1:] {
			row *= d
		}
		for r := range ranks {
			start := min(int64(r)*per, shape[0])
			n := min(per, shape[0]-start)
			off := append([]int64{start}, make([]int64, len(shape)-1)...)
			sz := append([]int64{n}, shape[1:]...)
			tm.Chunks = append(tm.Chunks, torchdcp.ChunkMetadata{Offsets: off, Sizes: sz})
			m.Storage = append(m.Storage, torchdcp.StorageEntry{Index: torchdcp.Index{FQN: "model." + name, Offset: off},
				Info: torchdcp.StorageInfo{RelativePath: torchdcp.ShardName(r, 0), Offset: sizes[r], Length: n * row}})
			sizes[r] += n * row
		}
		m.Items = append(m.Items, torchdcp.Item{FQN: "model." + name, Tensor: tm})
		m.Planner = append(m.Planner, torchdcp.PlannerEntry{Key: "model." + name, Path: []any{"model", name}})
	}
	add("model.embed_tokens.weight", []int64{rows, 16})
	add("model.norm.weight", []int64{16})
	f, err := os.Create(filepath.Join(dir, torchdcp.MetadataFile))
	require.NoError(t, err)
	require.NoError(t, torchdcp.EncodeMetadata(f, m.With(nil, nil, nil)))
	require.NoError(t, f.Close())
	if metadataOnly {
		return
	}
	for r, n := range sizes {
		f, err := os.Create(filepath.Join(dir, torchdcp.ShardName(r, 0)))
		require.NoError(t, err)
		require.NoError(t, f.Truncate(n))
		require.NoError(t, f.Close())
	}
}

func step(i int) string { return fmt.Sprintf("step_%02d", i) }

// fixture is a root of checkpoints and a cache of their views, counting
// the opener's calls.
type fixture struct {
	root  string
	tree  source.Tree // root, open as long as the cache (as a mount's)
	c     *Cache
	opens atomic.Int64 // every call of the opener
	again atomic.Int64 // those that were not an entry's first
	ids   atomic.Uint64
	fail  atomic.Pointer[error] // the opener's error while set
}

func newFixture(t *testing.T, n int, o Options) *fixture {
	t.Helper()
	fx := &fixture{root: t.TempDir()}
	for i := range n {
		writeDCP(t, filepath.Join(fx.root, step(i)), 64, false)
	}
	tree, err := source.OpenLocal(fx.root)
	require.NoError(t, err)
	t.Cleanup(func() { tree.Close() }) // after the cache's: cleanups run last first
	fx.tree = tree
	o.Open = fx.open
	fx.c = New(o)
	t.Cleanup(fx.c.Close)
	return fx
}

func (fx *fixture) open(dir string, format ckpt.Reader, first bool) (*view.View, []FileInfo, error) {
	fx.opens.Add(1)
	if !first {
		fx.again.Add(1)
	}
	if err := fx.fail.Load(); err != nil {
		return nil, nil, *err
	}
	sub, err := source.Sub(fx.tree, dir)
	if err != nil {
		return nil, nil, err
	}
	c, err := layout.OpenAs(format, sub)
	if err != nil {
		return nil, nil, err
	}
	v, err := view.Plan(c, view.Options{})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	var files []FileInfo
	if first {
		for _, vf := range v.Files {
			files = append(files, FileInfo{Name: vf.Name, Size: vf.Size, ModTime: vf.ModTime, ID: fx.ids.Add(1)})
		}
	}
	return v, files, nil
}

// show shows the checkpoint step(i), which must open.
func (fx *fixture) show(t *testing.T, i int) *Entry {
	t.Helper()
	e := fx.c.Show(step(i), step(i), nil)
	require.NoError(t, fx.c.Err(e))
	require.NotEmpty(t, e.Files())
	return e
}

func (fx *fixture) entry(t *testing.T, i int) EntryStats {
	t.Helper()
	for _, e := range fx.c.Stats().Entries {
		if e.Dir == step(i) {
			return e
		}
	}
	require.Fail(t, "no entry "+step(i))
	return EntryStats{}
}

// requireAccounted checks the cache's counts against its entries: the
// descriptors and metadata counted are those of the open views, the views
// counted those resident.
func requireAccounted(t *testing.T, c *Cache) Stats {
	t.Helper()
	st := c.Stats()
	var fds, views int
	var meta int64
	for _, e := range st.Entries {
		if e.Open {
			fds += ranks
			meta += e.MetadataBytes
		}
		if e.Resident {
			views++
			require.True(t, e.Open, e.Dir)
		}
	}
	require.Equal(t, fds, st.FDs)
	require.Equal(t, meta, st.MetadataBytes)
	require.Equal(t, views, st.Views)
	return st
}

// Views are closed least recently used first past the descriptor budget,
// and each is listed still; one opened again reuses its listing.
func TestDescriptorBudget(t *testing.T) {
	const n = 6
	fx := newFixture(t, n, Options{Limits: Limits{FDs: 2 * ranks}})
	first := fx.show(t, 0).Files()
	for i := range n {
		fx.show(t, i)
		st := requireAccounted(t, fx.c)
		require.LessOrEqual(t, st.FDs, 2*ranks)
		require.Equal(t, min(i+1, 2), st.Views)
		require.True(t, fx.entry(t, i).Resident)
		if i >= 2 {
			require.False(t, fx.entry(t, i-2).Open, "the least recently used is closed")
			require.True(t, fx.entry(t, i-1).Resident)
		}
	}
	require.Len(t, fx.c.Stats().Entries, n, "evicted views are still listed")
	require.Zero(t, fx.again.Load())

	e := fx.show(t, 0)
	require.Zero(t, fx.again.Load(), "Show of a shown entry opens nothing")
	v, err := fx.c.Acquire(e)
	require.NoError(t, err)
	require.EqualValues(t, 1, fx.again.Load(), "opened again")
	for _, f := range e.Files() {
		require.NotNil(t, v.File(f.Name), f.Name)
	}
	require.Equal(t, first, e.Files(), "the listing and its ids stay")
	v.Unref()
	require.True(t, fx.entry(t, 0).Resident)
	requireAccounted(t, fx.c)
}

// A use makes a view the most recently used: the other one goes first.
func TestUseRefreshes(t *testing.T) {
	fx := newFixture(t, 3, Options{Limits: Limits{Views: 2}})
	e0 := fx.show(t, 0)
	fx.show(t, 1)
	v, err := fx.c.Acquire(e0)
	require.NoError(t, err)
	v.Unref()
	fx.show(t, 2)
	require.True(t, fx.entry(t, 0).Resident)
	require.False(t, fx.entry(t, 1).Open)
	require.Zero(t, fx.again.Load())
}

func TestViewsLimit(t *testing.T) {
	fx := newFixture(t, 5, Options{Limits: Limits{Views: 3}})
	for i := range 5 {
		fx.show(t, i)
		require.Equal(t, min(i+1, 3), requireAccounted(t, fx.c).Views)
	}
}

// Past the metadata budget the least recently used views close; the
// newest stays even when it alone is over the budget.
func TestMetadataBudget(t *testing.T) {
	fx := newFixture(t, 1, Options{})
	fx.show(t, 0)
	one := fx.entry(t, 0).MetadataBytes
	require.Positive(t, one)

	for _, tc := range []struct {
		budget int64
		views  int
	}{{one * 5 / 2, 2}, {one * 3 / 2, 1}, {one / 2, 1}} {
		t.Run(fmt.Sprint(tc.views, tc.budget), func(t *testing.T) {
			fx := newFixture(t, 4, Options{Limits: Limits{Meta: tc.budget}})
			for i := range 4 {
				fx.show(t, i)
				st := requireAccounted(t, fx.c)
				require.Equal(t, min(i+1, tc.views), st.Views)
				require.LessOrEqual(t, st.MetadataBytes, max(tc.budget, one))
				require.True(t, fx.entry(t, i).Open, "the newest view always opens")
			}
		})
	}
}

// A reference pins a view: evicted from the LRU it stays open, its
// descriptors counted, until its last user is done; used again meanwhile,
// it is the same view, back in the LRU.
func TestReferencePinsView(t *testing.T) {
	fx := newFixture(t, 3, Options{Limits: Limits{FDs: ranks}})
	e0 := fx.show(t, 0)
	v, err := fx.c.Acquire(e0)
	require.NoError(t, err)
	fx.show(t, 1)
	fx.show(t, 2)
	st := fx.entry(t, 0)
	require.True(t, st.Open && !st.Resident, "evicted, not closed")
	require.False(t, v.Closed())
	require.Equal(t, 2*ranks, requireAccounted(t, fx.c).FDs, "a pinned view's descriptors count")
	require.True(t, v.Ref())
	v.Unref()

	again, err := fx.c.Acquire(e0)
	require.NoError(t, err)
	require.Same(t, v, again)
	require.True(t, fx.entry(t, 0).Resident)
	require.False(t, fx.entry(t, 2).Open, "made room")
	again.Unref()
	v.Unref()
	require.False(t, v.Closed(), "the LRU's reference")

	v1, err := fx.c.Acquire(fx.show(t, 1))
	require.NoError(t, err)
	v1.Unref()
	require.True(t, v.Closed(), "evicted, and no user left")
	require.False(t, v.Ref(), "a closed view is never taken again")
	require.False(t, fx.entry(t, 0).Open)
	v2, err := fx.c.Acquire(e0)
	require.NoError(t, err)
	require.NotSame(t, v, v2)
	v2.Unref()
	requireAccounted(t, fx.c)
}

// A checkpoint changed while its view was evicted is an error when the
// view is opened again, for good, and logged once; the others go on.
func TestReopenedChanged(t *testing.T) {
	for _, change := range []string{"shard", "metadata", "records"} {
		t.Run(change, func(t *testing.T) {
			fx := newFixture(t, 2, Options{Limits: Limits{Views: 1}})
			e0 := fx.show(t, 0)
			fx.show(t, 1)
			require.False(t, fx.entry(t, 0).Open)
			dir := filepath.Join(fx.root, step(0))
			if change == "shard" {
				shard := filepath.Join(dir, torchdcp.ShardName(1, 0))
				info, err := os.Stat(shard)
				require.NoError(t, err)
				require.NoError(t, os.Remove(shard)) // same size, new file
				require.NoError(t, os.WriteFile(shard, nil, 0o644))
				require.NoError(t, os.Truncate(shard, info.Size()))
			} else if change == "metadata" {
				writeDCP(t, dir, 60, true) // other offsets, the shard files as they were
			} else {
				moveRecords(t, dir)
			}
			_, err := fx.c.Acquire(e0)
			require.ErrorIs(t, err, ckpt.ErrSourceChanged)
			if change != "shard" {
				require.ErrorContains(t, err, "the checkpoint was rewritten")
			}
			require.ErrorIs(t, fx.c.Err(e0), ckpt.ErrSourceChanged)
			opens := fx.opens.Load()
			_, err = fx.c.Acquire(e0)
			require.ErrorIs(t, err, ckpt.ErrSourceChanged)
			require.Equal(t, opens, fx.opens.Load(), "not opened again")
			require.Equal(t, fx.entry(t, 0).Err, fx.c.Err(e0))

			v, err := fx.c.Acquire(fx.show(t, 1))
			require.NoError(t, err)
			v.Unref()
			requireAccounted(t, fx.c)
		})
	}
}

// moveRecords rewrites dir's .metadata with each shard file's records in
// the other order: the same tensors, shapes and files, the bytes of each
// chunk elsewhere (what only the chunks' places in the digest tell).
func moveRecords(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, torchdcp.MetadataFile))
	require.NoError(t, err)
	m, err := torchdcp.DecodeMetadata(bytes.NewReader(b))
	require.NoError(t, err)
	byFile := map[string][]int{}
	for i, e := range m.Storage {
		byFile[e.Info.RelativePath] = append(byFile[e.Info.RelativePath], i)
	}
	for _, idx := range byFile {
		require.Len(t, idx, 2)
		a, c := &m.Storage[idx[0]].Info, &m.Storage[idx[1]].Info
		require.Zero(t, a.Offset)
		c.Offset, a.Offset = 0, c.Length
	}
	f, err := os.Create(filepath.Join(dir, torchdcp.MetadataFile))
	require.NoError(t, err)
	require.NoError(t, torchdcp.EncodeMetadata(f, m))
	require.NoError(t, f.Close())
}

// An unchanged checkpoint opened again gives the same view: the digest of
// its metadata matches, and so every file's name and size.
func TestReopenedSame(t *testing.T) {
	fx := newFixture(t, 2, Options{Limits: Limits{Views: 1}})
	e0 := fx.show(t, 0)
	fx.show(t, 1)
	v, err := fx.c.Acquire(e0)
	require.NoError(t, err)
	defer v.Unref()
	require.EqualValues(t, 1, fx.again.Load())
	for _, f := range e0.Files() {
		require.Equal(t, f.Size, v.File(f.Name).Size, f.Name)
	}
	require.Equal(t, e0.digest, digest(fx.c.seed, v.view))
}

// A first open that fails fails the view for good; one the source failed
// (Transient) is tried again at the next use.
func TestFirstOpenFails(t *testing.T) {
	outage := errors.New("the store does not answer")
	broken := errors.New("broken checkpoint")
	fx := newFixture(t, 2, Options{Transient: func(err error) bool { return errors.Is(err, outage) }})
	fx.fail.Store(&outage)
	e := fx.c.Show(step(0), step(0), nil)
	require.NoError(t, fx.c.Err(e))
	require.Empty(t, fx.c.Stats().Entries, "not shown, not failed")
	fx.fail.Store(nil)
	fx.show(t, 0)

	fx.fail.Store(&broken)
	e = fx.c.Show(step(1), step(1), nil)
	require.ErrorIs(t, fx.c.Err(e), broken)
	fx.fail.Store(nil)
	opens := fx.opens.Load()
	e = fx.c.Show(step(1), step(1), nil)
	require.ErrorIs(t, fx.c.Err(e), broken)
	_, err := fx.c.Acquire(e)
	require.ErrorIs(t, err, broken)
	require.Equal(t, opens, fx.opens.Load())
	require.ErrorIs(t, fx.entry(t, 1).Err, broken)
}

// Close closes every open view, in use or not; later uses are ErrClosed.
func TestClose(t *testing.T) {
	fx := newFixture(t, 2, Options{})
	e0 := fx.show(t, 0)
	fx.show(t, 1)
	v, err := fx.c.Acquire(e0)
	require.NoError(t, err)
	fx.c.Close()
	require.True(t, v.Closed(), "in use")
	v.Unref()
	_, err = fx.c.Acquire(e0)
	require.ErrorIs(t, err, ErrClosed)
}

// Users acquiring and releasing views at once, under budgets that evict
// all the time: every view they get is open, and once they are done the
// counts match the open views and the budget.
func TestConcurrentUse(t *testing.T) {
	const n, users = 5, 8
	fx := newFixture(t, n, Options{Limits: Limits{FDs: 2 * ranks}})
	entries := make([]*Entry, n)
	for i := range n {
		entries[i] = fx.show(t, i)
	}
	var wg sync.WaitGroup
	for u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 60 {
				v, err := fx.c.Acquire(entries[(u+k)%n])
				if !assertNoError(t, err) {
					return
				}
				if v.Closed() || v.File(entries[(u+k)%n].Files()[0].Name) == nil {
					t.Error("an acquired view is open and whole")
				}
				v.Unref()
			}
		}()
	}
	wg.Wait()
	st := requireAccounted(t, fx.c)
	require.LessOrEqual(t, st.FDs, 2*ranks)
	for _, e := range st.Entries {
		require.Equal(t, e.Open, e.Resident, "no user is left: only the LRU holds views")
	}
}

func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

// TestDigestInParts: a digest summed in parts on several cores tells a
// changed checkpoint from the one shown, as one summed in one part does,
// and an unchanged one is the same sum.
func TestDigestInParts(t *testing.T) {
	w, n := digestWorkers, digestPartChunks
	t.Cleanup(func() { digestWorkers, digestPartChunks = w, n })
	digestWorkers, digestPartChunks = 3, 1
	fx := newFixture(t, 1, Options{})
	v, err := fx.c.Acquire(fx.show(t, 0))
	require.NoError(t, err)
	defer v.Unref()
	require.Greater(t, len(digestParts(fx.c.seed, v.view.Checkpoint.Tensors)), 1)
	d := digest(fx.c.seed, v.view)
	for range 5 {
		require.Equal(t, d, digest(fx.c.seed, v.view))
	}
	t.Run("TestReopenedChanged", TestReopenedChanged)
	t.Run("TestReopenedSame", TestReopenedSame)
}
