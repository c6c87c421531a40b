package layout

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
)

// recordingTree records every read and every prefetch of its files.
type recordingTree struct {
	source.Tree
	mu      sync.Mutex
	reads   []recorded
	fetched []recorded
}

type recorded struct {
	file       string
	start, end int64
}

func (t *recordingTree) Open(name string) (source.File, error) {
	f, err := t.Tree.Open(name)
	if err != nil {
		return nil, err
	}
	return &recordingFile{File: f, name: name, t: t}, nil
}

func (t *recordingTree) take() (reads, fetched []recorded) {
	t.mu.Lock()
	defer t.mu.Unlock()
	reads, fetched = t.reads, t.fetched
	t.reads, t.fetched = nil, nil
	return reads, fetched
}

type recordingFile struct {
	source.File
	name string
	t    *recordingTree
}

func (f *recordingFile) ReadAt(p []byte, off int64) (int, error) {
	f.t.mu.Lock()
	f.t.reads = append(f.t.reads, recorded{f.name, off, off + int64(len(p))})
	f.t.mu.Unlock()
	return f.File.ReadAt(p, off)
}

func (f *recordingFile) Prefetch(off, n int64) {
	f.t.mu.Lock()
	defer f.t.mu.Unlock()
	f.t.fetched = append(f.t.fetched, recorded{f.name, off, off + n})
}

// covered reports whether r lies within the union of rs.
func covered(r recorded, rs []recorded) bool {
	var in []recorded
	for _, s := range rs {
		if s.file == r.file && s.end > r.start && s.start < r.end {
			in = append(in, s)
		}
	}
	slices.SortFunc(in, func(a, b recorded) int { return int(a.start - b.start) })
	at := r.start
	for _, s := range in {
		if s.start > at {
			return false
		}
		at = max(at, s.end)
	}
	return at >= r.end
}

// Every source byte a read of a view needs was asked for by a Prefetch of
// the same range first, for every framework's checkpoint and mapping
// (stored, box-sharded, fused and split, RoPE-permuted, cast): fetching
// ahead is as good as its hints.
func TestPrefetchCoversReads(t *testing.T) {
	// Sources whose bytes are not stored as they are in one range: a ZeRO
	// partition spans ranks' flat buffers, a zstd record is decompressed.
	unlocatable := map[string]bool{"deepspeed_zero2_llama": true, "deepspeed_zero3_llama": true, "zstd": true}
	for _, fc := range fixtureCases(t) {
		for _, fv := range fc.Views {
			for _, mapped := range []bool{false, true} {
				name := fc.Name + "/" + fv.Dir
				if mapped {
					name += "/hf"
				}
				t.Run(name, func(t *testing.T) {
					dir := filepath.Join(fc.Dir, fv.Dir)
					local, err := source.OpenLocal(dir)
					require.NoError(t, err)
					defer local.Close()
					tree := &recordingTree{Tree: local}
					c, err := OpenTree(tree)
					require.NoError(t, err)
					defer c.Close()
					opts := PlanOptions{NoMapping: !mapped, MaxShardSize: 50_000}
					if _, err := os.Stat(filepath.Join(fc.Dir, "hf_config")); err == nil && mapped {
						opts.HFConfigDir = filepath.Join(fc.Dir, "hf_config")
					}
					v, err := Plan(c, opts)
					require.NoError(t, err)
					defer v.closeExtra()
					var reads, fetched int
					for _, f := range v.Files {
						if f.Kind == KindGenerated {
							continue
						}
						for _, w := range []int64{4096, 70_000} {
							buf := make([]byte, w)
							for off := int64(0); off < f.Size; off += w {
								tree.take()
								f.Prefetch(off, w)
								_, wanted := tree.take()
								_, err := f.ReadAt(buf, off)
								if !errors.Is(err, io.EOF) {
									require.NoError(t, err)
								}
								got, _ := tree.take()
								reads += len(got)
								for _, r := range got {
									if covered(r, wanted) {
										fetched++
									} else if !unlocatable[fc.Name] {
										t.Fatalf("%s [%d, +%d): read %s [%d, %d) was not fetched ahead (asked: %v)", f.Name, off, w, r.file, r.start, r.end, wanted)
									}
								}
							}
						}
					}
					if !unlocatable[fc.Name] {
						require.NotZero(t, reads, "the view read nothing from its sources")
						assert.Equal(t, reads, fetched)
					}
					t.Logf("%d source reads, %d fetched ahead", reads, fetched)
				})
			}
		}
	}
}

// fetchLog is a Prefetcher that records what it is asked for.
type fetchLog struct {
	mu  sync.Mutex
	got []recorded
}

func (l *fetchLog) Prefetch(off, n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, recorded{"", off, off + n})
}

func (l *fetchLog) wait(t *testing.T, n int) []recorded {
	t.Helper()
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.got) >= n
	}, 5*time.Second, time.Millisecond)
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.got)
	slices.SortFunc(out, func(a, b recorded) int { return int(a.start - b.start) })
	return out
}

func TestReadAheadFollowsStreams(t *testing.T) {
	const mib = 1 << 20
	t.Run("sequential", func(t *testing.T) {
		l := &fetchLog{}
		r := NewReadAhead(l, 100*mib, 8*mib)
		r.Reading(0, mib) // a lone read fetches nothing
		r.Reading(mib, mib)
		got := l.wait(t, 1)
		assert.Equal(t, []recorded{{"", 2 * mib, 10 * mib}}, got, "the next depth, from where the reads got to")
		r.Reading(2*mib, mib)
		r.Reading(3*mib, mib)
		r.Reading(4*mib, mib)
		r.Reading(5*mib, mib) // 6 MiB read, 10 MiB asked: half a depth ahead
		r.Reading(6*mib, mib) // less than half
		got = l.wait(t, 2)
		assert.Equal(t, recorded{"", 10 * mib, 15 * mib}, got[1], "topped up to a depth ahead, nothing twice")
		assert.Len(t, l.wait(t, 2), 2)
	})
	t.Run("out of order read-ahead continues the stream", func(t *testing.T) {
		l := &fetchLog{}
		r := NewReadAhead(l, 100*mib, 8*mib)
		r.Reading(0, mib)
		r.Reading(2*mib, mib) // the kernel's read-ahead requests overtake each other
		r.Reading(mib, mib)
		got := l.wait(t, 1)
		assert.Equal(t, recorded{"", 3 * mib, 11 * mib}, got[0])
	})
	t.Run("a jump starts a new stream; several streams", func(t *testing.T) {
		l := &fetchLog{}
		r := NewReadAhead(l, 1000*mib, 8*mib)
		for s := int64(0); s < maxStreams; s++ {
			r.Reading(s*100*mib, mib)
		}
		for s := int64(0); s < maxStreams; s++ {
			r.Reading(s*100*mib+mib, mib)
		}
		got := l.wait(t, maxStreams)
		require.Len(t, got, maxStreams)
		for s, g := range got {
			assert.Equal(t, recorded{"", int64(s)*100*mib + 2*mib, int64(s)*100*mib + 10*mib}, g)
		}
	})
	t.Run("stops at the end of the file", func(t *testing.T) {
		l := &fetchLog{}
		r := NewReadAhead(l, 3*mib, 8*mib)
		r.Reading(0, mib)
		r.Reading(mib, mib)
		r.Reading(2*mib, mib)
		got := l.wait(t, 1)
		assert.Equal(t, []recorded{{"", 2 * mib, 3 * mib}}, got)
	})
}
