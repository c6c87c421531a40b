package dcpwrite

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/safetensors"
)

// trickle is a Source whose bytes arrive step bytes at a time from
// a feeder goroutine. It records a read beyond what Wait accepted.
type trickle struct {
	data []byte

	mu      sync.Mutex
	cond    sync.Cond
	avail   int64 // bytes arrived
	claimed int64 // largest end Wait accepted
	stop    error // Wait returns it when set
	bad     error // first read beyond claimed
}

func newTrickle(data []byte, step int) *trickle {
	s := &trickle{data: data}
	s.cond.L = &s.mu
	go func() {
		for {
			s.mu.Lock()
			s.avail = min(s.avail+int64(step), int64(len(s.data)))
			done := s.avail == int64(len(s.data)) || s.stop != nil
			s.cond.Broadcast()
			s.mu.Unlock()
			if done {
				return
			}
			runtime.Gosched()
		}
	}()
	return s
}

func (s *trickle) Wait(end int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.avail < end && s.stop == nil {
		s.cond.Wait()
	}
	if s.stop != nil {
		return s.stop
	}
	s.claimed = max(s.claimed, end)
	return nil
}

func (s *trickle) ReadAt(b []byte, off int64) (int, error) {
	s.mu.Lock()
	if off+int64(len(b)) > s.claimed && s.bad == nil {
		s.bad = fmt.Errorf("read [%d, %d) beyond the %d bytes Wait accepted", off, off+int64(len(b)), s.claimed)
	}
	s.mu.Unlock()
	if off >= int64(len(s.data)) {
		return 0, errShortSource
	}
	n := copy(b, s.data[off:])
	if n < len(b) {
		return n, errShortSource
	}
	return n, nil
}

func (s *trickle) abandon(err error) {
	s.mu.Lock()
	s.stop = err
	s.cond.Broadcast()
	s.mu.Unlock()
}

// eagerCommit commits f into d eagerly, its bytes trickling in.
func eagerCommit(t *testing.T, d *Dir, f *stFile, step int) error {
	t.Helper()
	src := newTrickle(f.data, step)
	e, err := d.Reshard(src, f.header)
	if err != nil {
		return err
	}
	if err := e.Run(); err != nil {
		e.Discard()
		return err
	}
	require.NoError(t, src.bad)
	require.True(t, e.Matches(f.header))
	return e.Commit()
}

// eagerFiles are two files whose tensors cover the placements: dim 0,
// dim 1 (m, t3), replicated, a scalar, empty and uneven tensors.
func eagerFiles(t *testing.T) []*stFile {
	return []*stFile{
		makeST(t, 11,
			spec{"m", safetensors.F32, []int64{13, 7}}, spec{"t3", safetensors.BF16, []int64{4, 5, 6}},
			spec{"rep.w", safetensors.F16, []int64{3, 3}}, spec{"scalar", safetensors.I64, nil},
			spec{"empty", safetensors.F32, []int64{0, 4}}, spec{"d2", safetensors.I8, []int64{2, 9}},
			spec{"flag", safetensors.BOOL, []int64{5}}),
		makeST(t, 12,
			spec{"big", safetensors.F64, []int64{37, 11}}, spec{"m2", safetensors.U8, []int64{6, 40}},
			spec{"f8", safetensors.F8_E4M3, []int64{9, 2}}),
	}
}

// TestEagerMatchesCommit: an eager commit writes the same bytes as Commit
// (shard files and .metadata), whatever the placement, and reads back.
func TestEagerMatchesCommit(t *testing.T) {
	rules := "^m 1\n^t3 2\n^rep\\. replicate\n"
	for _, tc := range []struct {
		name    string
		target  Target
		copyBuf int
	}{
		{"world1", Target{WorldSize: 1}, 0},
		{"world3", Target{WorldSize: 3}, 0},
		{"world4", Target{WorldSize: 4}, 0},
		{"world4-shard1", Target{WorldSize: 4, Rules: mustRules(t, rules), Prefix: "model"}, 0},
		{"world3-batching", Target{WorldSize: 3, Rules: mustRules(t, rules)}, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.copyBuf > 0 {
				defer func(n int) { copyBufSize = n }(copyBufSize)
				copyBufSize = tc.copyBuf
			}
			files := eagerFiles(t)
			plain, eager := filepath.Join(t.TempDir(), "plain"), filepath.Join(t.TempDir(), "eager")
			exps := commitAll(t, plain, tc.target, files...)
			d, err := openDir(eager, tc.target, nil)
			require.NoError(t, err)
			for i, f := range files {
				require.NoError(t, eagerCommit(t, d, f, 7+i*50), "file %d", i)
			}
			assert.Equal(t, snapshot(t, plain), snapshot(t, eager), "eager and plain commits differ")
			verifyDir(t, eager, exps)
		})
	}
}

func TestEagerFailureCommitsNothing(t *testing.T) {
	first := makeST(t, 1, spec{"a", safetensors.F32, []int64{5, 3}})
	second := makeST(t, 2, spec{"c", safetensors.F32, []int64{70, 30}}, spec{"d", safetensors.U16, []int64{90}},
		spec{"e", safetensors.F32, []int64{40, 3}})
	target := Target{WorldSize: 3}
	injected := errors.New("injected")
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, d *Dir) error
		is   error
	}{
		{"disk full mid-run", func(t *testing.T, d *Dir) error {
			budget := int64(6000) // a few chunks get written first
			d.create = func(p string, excl bool) (outFile, error) {
				f, err := d.createFile(p, excl)
				if err != nil {
					return nil, err
				}
				return failingFile{f.(*os.File), &budget, syscall.ENOSPC}, nil
			}
			return eagerCommit(t, d, second, 100)
		}, syscall.ENOSPC},
		{"before metadata", func(t *testing.T, d *Dir) error {
			d.beforeMetadata = func() error { return injected }
			return eagerCommit(t, d, second, 100)
		}, injected},
		{"abandoned", func(t *testing.T, d *Dir) error {
			src := &trickle{data: second.data, avail: int64(len(second.data)) / 2}
			src.cond.L = &src.mu
			e, err := d.Reshard(src, second.header)
			require.NoError(t, err)
			go func() {
				time.Sleep(20 * time.Millisecond)
				src.abandon(injected)
			}()
			err = e.Run()
			require.NotEmpty(t, shardFiles(t, d.Path()), "the first chunks were written")
			e.Discard()
			return err
		}, injected},
		{"name committed meanwhile", func(t *testing.T, d *Dir) error {
			src := newTrickle(second.data, 1<<20)
			e, err := d.Reshard(src, second.header)
			require.NoError(t, err)
			require.NoError(t, e.Run())
			other := makeST(t, 3, spec{"d", safetensors.F32, []int64{2}})
			require.NoError(t, d.Commit(other.reader(), other.header))
			return e.Commit()
		}, ErrExists},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "c")
			commitAll(t, dir, target, first)
			d, err := openDir(dir, target, nil)
			require.NoError(t, err)
			before := snapshot(t, dir)
			committed := d.Committed()
			err = tc.run(t, d)
			require.ErrorIs(t, err, tc.is)
			now := snapshot(t, dir)
			if tc.is == ErrExists { // the other commit stands
				assert.Equal(t, []string{"a", "d"}, d.Committed())
				assert.Len(t, shardFiles(t, dir), 3+3)
				return
			}
			assert.Equal(t, before, now, "directory changed by a failed eager commit")
			assert.Equal(t, committed, d.Committed())
			// Usable afterwards, and the number was given back.
			d.beforeMetadata, d.create = nil, d.createFile
			require.NoError(t, d.Commit(second.reader(), second.header))
			assert.Contains(t, shardFiles(t, dir), "__0_1.distcp")
			verifyDir(t, dir, append(expect(target, first), expect(target, second)...))
		})
	}
}

// TestEagerNumbering: a commit made while an eager commit is under way
// takes another file number; both commit.
func TestEagerNumbering(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "n")
	target := Target{WorldSize: 2}
	d, err := openDir(dir, target, nil)
	require.NoError(t, err)
	a := makeST(t, 1, spec{"a", safetensors.F32, []int64{6, 2}})
	b := makeST(t, 2, spec{"b", safetensors.F32, []int64{6, 2}})
	c := makeST(t, 3, spec{"c", safetensors.F32, []int64{6, 2}})
	ea, err := d.Reshard(newTrickle(a.data, 1<<20), a.header)
	require.NoError(t, err)
	require.NoError(t, d.Commit(b.reader(), b.header))
	require.NoError(t, ea.Run())
	eb, err := d.Reshard(newTrickle(c.data, 1<<20), c.header)
	require.NoError(t, err)
	eb.Discard() // gives its number back
	require.NoError(t, ea.Commit())
	require.NoError(t, d.Commit(c.reader(), c.header))
	assert.Equal(t, []string{"__0_0.distcp", "__0_1.distcp", "__0_2.distcp", "__1_0.distcp", "__1_1.distcp", "__1_2.distcp"}, shardFiles(t, dir))
	assert.Equal(t, []string{"b", "a", "c"}, d.Committed())
	verifyDir(t, dir, append(append(expect(target, a), expect(target, b)...), expect(target, c)...))
}

// TestEagerMemoryBounded: with many ranks an eager commit holds one copy
// buffer and one record buffer, not one buffer per rank.
func TestEagerMemoryBounded(t *testing.T) {
	const rows, cols = 4096, 1024
	infos := safetensors.Layout([]safetensors.TensorInfo{{Name: "big", DType: safetensors.F32, Shape: []int64{rows, cols}}})
	const dataStart = 64
	h := &safetensors.Header{Tensors: infos, DataStart: dataStart}
	d, err := openDir(filepath.Join(t.TempDir(), "big"), Target{WorldSize: 512}, nil)
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	e, err := d.Reshard(readyPattern{patternFile{size: dataStart + infos[0].End}}, h)
	require.NoError(t, err)
	require.NoError(t, e.Run())
	require.NoError(t, e.Commit())
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("eager commit of a %d MiB tensor over 512 ranks allocated %.1f MiB", infos[0].Size()>>20, float64(alloc)/(1<<20))
	assert.Less(t, alloc, uint64(12<<20))
}

type readyPattern struct{ patternFile }

func (readyPattern) Wait(int64) error { return nil }

func TestReshardTooMany(t *testing.T) {
	d, err := openDir(filepath.Join(t.TempDir(), "b"), Target{}, nil)
	require.NoError(t, err)
	f := makeST(t, 1, spec{"a", safetensors.F32, []int64{4}})
	var es []*Reshard
	for range maxGrowing {
		e, err := d.Reshard(newTrickle(f.data, 1<<20), f.header)
		require.NoError(t, err)
		es = append(es, e)
	}
	_, err = d.Reshard(newTrickle(f.data, 1<<20), f.header)
	require.ErrorIs(t, err, ErrTooMany)
	// The bound is the Limits', not the process's: a Dir sharing them is
	// refused too, one with limits of its own is not.
	shared, err := openDir(filepath.Join(t.TempDir(), "shared"), Target{}, d.limits)
	require.NoError(t, err)
	_, err = shared.Reshard(newTrickle(f.data, 1<<20), f.header)
	require.ErrorIs(t, err, ErrTooMany)
	own, err := openDir(filepath.Join(t.TempDir(), "own"), Target{}, nil)
	require.NoError(t, err)
	e, err := own.Reshard(newTrickle(f.data, 1<<20), f.header)
	require.NoError(t, err)
	e.Discard()
	for _, e := range slices.Backward(es) {
		e.Discard() // gives its number back: the last reserved goes first
	}
	e, err = d.Reshard(newTrickle(f.data, 1<<20), f.header)
	require.NoError(t, err)
	require.NoError(t, e.Run())
	require.NoError(t, e.Commit())
	assert.Equal(t, []string{"__0_0.distcp"}, shardFiles(t, d.Path()))
}

func TestRemoveStale(t *testing.T) {
	openDir := func(path string) *source.Dir {
		d, err := source.OpenDir(path)
		require.NoError(t, err)
		t.Cleanup(func() { d.Close() })
		return d
	}
	dir := filepath.Join(t.TempDir(), "k")
	commitAll(t, dir, Target{WorldSize: 2}, makeST(t, 1, spec{"a", safetensors.F32, []int64{5, 3}}))
	keep := snapshot(t, dir)
	for _, n := range []string{"__0_1.distcp", "__1_1.distcp", ".metadata.tmp"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte("partial"), 0o644))
	}
	removed, err := RemoveStale(openDir(dir))
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"__0_1.distcp", "__1_1.distcp", ".metadata.tmp"}, removed)
	assert.Equal(t, keep, snapshot(t, dir))

	// No .metadata: every shard file is stale, unless torch's rank-local
	// metadata says this is not ours.
	dir2 := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir2, "__0_0.distcp"), nil, 0o644))
	root2 := openDir(dir2)
	removed, err = RemoveStale(root2)
	require.NoError(t, err)
	assert.Equal(t, []string{"__0_0.distcp"}, removed)
	require.NoError(t, os.WriteFile(filepath.Join(dir2, "__0_0.distcp"), nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir2, "__0.metadata"), nil, 0o644))
	removed, err = RemoveStale(root2)
	require.NoError(t, err)
	assert.Empty(t, removed)
}
