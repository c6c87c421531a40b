package dcpwrite

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// directOp is one call on a shard file: an append (patch false) or a patch
// of n bytes at off (relative to the end when negative).
type directOp struct {
	n     int
	patch bool
	off   int
	sync  bool // Sync before this op
}

// runDirect applies ops to f and to a model of the file, then closes f and
// checks the file holds exactly the model's bytes.
func runDirect(t *testing.T, f outFile, path string, ops []directOp, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	var model []byte
	for i, op := range ops {
		if op.sync {
			require.NoError(t, f.Sync(), "op %d", i)
		}
		b := make([]byte, op.n)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		if !op.patch {
			n, err := f.Write(b)
			require.NoError(t, err, "op %d", i)
			require.Equal(t, len(b), n, "op %d", i)
			model = append(model, b...)
			continue
		}
		off := op.off
		if off < 0 {
			off += len(model)
		}
		n, err := f.WriteAt(b, int64(off))
		require.NoError(t, err, "op %d", i)
		require.Equal(t, len(b), n, "op %d", i)
		copy(model[off:], b)
	}
	require.NoError(t, f.Close())
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, len(model), len(got))
	require.True(t, string(model) == string(got), "file content differs from what was written")
}

// newShard creates a shard file to write.
func newShard(t *testing.T) (*os.File, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "__0_0.distcp")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	require.NoError(t, err)
	return f, path
}

// streaming is f written by a directFile without O_DIRECT: the tail and
// patch bookkeeping of a direct file on any filesystem.
func streaming(f *os.File) *directFile {
	align := os.Getpagesize()
	return &directFile{f: f, align: align, tail: make([]byte, 0, align)}
}

// directCases are written as a shard is: record headers, data runs that
// cross alignment units and staging buffers, CRC patches behind the data.
var directCases = map[string][]directOp{
	"nothing":               nil,
	"less than a unit":      {{n: 100}},
	"exactly a unit":        {{n: 4096}},
	"units and a tail":      {{n: 3*4096 + 17}},
	"many small":            {{n: 1}, {n: 4095}, {n: 1}, {n: 7}, {n: 4096}, {n: 8191}, {n: 3}},
	"larger than staging":   {{n: 100}, {n: 3*stagingSize + 5}, {n: 4000}},
	"exact staging":         {{n: stagingSize}, {n: stagingSize}},
	"patch in tail":         {{n: 5000}, {n: 8, patch: true, off: -8}},
	"patch on disk":         {{n: 64}, {n: 3 * stagingSize}, {n: 8, patch: true, off: 30}},
	"patch across the base": {{n: 2*4096 + 10}, {n: 100, patch: true, off: 4096 + 4000}},
	"patch then stream":     {{n: 9000}, {n: 16, patch: true, off: 2}, {n: 70000}, {n: 4, patch: true, off: -4}, {n: 12}},
	"writes after sync":     {{n: 5000}, {n: 300, sync: true}, {n: 9000}, {n: 5, patch: true, off: 10}},
	"sync of nothing":       {{n: 0, sync: true}, {n: 4097}},
}

func TestDirectFile(t *testing.T) {
	for name, ops := range directCases {
		t.Run(name, func(t *testing.T) {
			f, path := newShard(t)
			out := directOut(f)
			if _, ok := out.(*directFile); !ok {
				t.Logf("%s does not support O_DIRECT: testing the buffered fallback", filepath.Dir(path))
			}
			runDirect(t, out, path, ops, 1)
		})
	}
}

// TestDirectFileStreaming runs the cases through the streaming logic even
// where the filesystem refuses O_DIRECT: every write then takes the
// buffered path, but the tail and patch bookkeeping are the same.
func TestDirectFileStreaming(t *testing.T) {
	for name, ops := range directCases {
		t.Run(name, func(t *testing.T) {
			f, path := newShard(t)
			runDirect(t, streaming(f), path, ops, 2)
		})
	}
}

func TestDirectFileRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for seed := range uint64(20) {
		var ops []directOp
		size := 0
		for range 40 {
			op := directOp{n: rng.IntN(20000), sync: rng.IntN(30) == 0}
			if rng.IntN(8) == 0 {
				op.n = rng.IntN(3 * stagingSize)
			}
			if size > 0 && rng.IntN(4) == 0 {
				op.patch = true
				op.off = rng.IntN(size)
				op.n = rng.IntN(min(size-op.off, 64) + 1)
			} else {
				size += op.n
			}
			ops = append(ops, op)
		}
		f, path := newShard(t)
		runDirect(t, directOut(f), path, ops, seed)
	}
}

func TestDirectFilePatchPastEnd(t *testing.T) {
	f, _ := newShard(t)
	d := streaming(f)
	_, err := d.Write(make([]byte, 10))
	require.NoError(t, err)
	_, err = d.WriteAt([]byte{1, 2}, 9)
	require.ErrorContains(t, err, "past the end 10")
	require.NoError(t, d.Close())
}

// TestDirectFileRefused: where the filesystem supports O_DIRECT, a direct
// write it refuses (here: staging memory misaligned on purpose, EINVAL) is
// done again buffered, and the file stays buffered, patches included.
// Where it does not, directOut leaves the file as it is.
func TestDirectFileRefused(t *testing.T) {
	f, path := newShard(t)
	out := directOut(f)
	d, ok := out.(*directFile)
	if !ok {
		require.Same(t, f, out, "no O_DIRECT on %s: the file itself", filepath.Dir(path))
		require.NoError(t, f.Close())
		return
	}
	require.True(t, d.direct)
	d.staging = alignedBuffer(stagingSize + 1)[1:]
	runDirect(t, d, path, []directOp{{n: 3 * stagingSize}, {n: 8, patch: true, off: 100}, {n: 5000}}, 3)
	require.True(t, d.refused)
	require.False(t, d.direct)
}
