package view

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/safetensors"
)

// chunking cuts shape into boxes the way one of the layouts ckptfs meets
// does: whole, split along dim 0 (FSDP), along another dim (TP), a grid over
// two dims (2-D mesh), or irregularly (recursive cuts along random dims).
func chunking(rng *rand.Rand, shape []int64) (kind string, boxes [][2][]int64) {
	whole := [2][]int64{make([]int64, len(shape)), slices.Clone(shape)}
	if len(shape) == 0 {
		return "0-dim", [][2][]int64{whole}
	}
	cutsAlong := func(d, n int) []int64 { // n cut points in [0, shape[d]], sorted, repeats allowed
		cs := make([]int64, n)
		for i := range cs {
			cs[i] = rng.Int63n(shape[d] + 1)
		}
		slices.Sort(cs)
		return cs
	}
	grid := func(dims ...int) [][2][]int64 {
		out := [][2][]int64{whole}
		for _, d := range dims {
			bounds := append(append([]int64{0}, cutsAlong(d, 1+rng.Intn(4))...), shape[d])
			var next [][2][]int64
			for _, b := range out {
				for i := 0; i+1 < len(bounds); i++ { // repeated bounds make empty chunks
					off, size := slices.Clone(b[0]), slices.Clone(b[1])
					off[d], size[d] = bounds[i], bounds[i+1]-bounds[i]
					next = append(next, [2][]int64{off, size})
				}
			}
			out = next
		}
		return out
	}
	switch mode := rng.Intn(5); {
	case mode == 0:
		return "whole", [][2][]int64{whole}
	case mode == 1:
		return "dim 0", grid(0)
	case mode == 2:
		d := rng.Intn(len(shape))
		return fmt.Sprintf("dim %d", d), grid(d)
	case mode == 3 && len(shape) >= 2:
		a := rng.Intn(len(shape))
		b := (a + 1 + rng.Intn(len(shape)-1)) % len(shape)
		return fmt.Sprintf("grid %d×%d", a, b), grid(a, b)
	default:
		boxes := [][2][]int64{whole}
		for range rng.Intn(8) {
			i, d := rng.Intn(len(boxes)), rng.Intn(len(shape))
			b := boxes[i]
			if b[1][d] < 2 {
				continue
			}
			cut := 1 + rng.Int63n(b[1][d]-1)
			lo, hi := [2][]int64{slices.Clone(b[0]), slices.Clone(b[1])}, [2][]int64{slices.Clone(b[0]), slices.Clone(b[1])}
			lo[1][d] = cut
			hi[0][d] += cut
			hi[1][d] -= cut
			boxes[i] = lo
			boxes = append(boxes, hi)
		}
		return "irregular", boxes
	}
}

// randomTensor is a tensor of random dtype and shape chunked by chunking,
// with empty chunks thrown in and the chunks shuffled, and its C-order bytes.
func randomTensor(rng *rand.Rand, name string, dtypes []safetensors.DType) (*ckpt.Tensor, []byte, string) {
	dt := dtypes[rng.Intn(len(dtypes))]
	shape := make([]int64, rng.Intn(5))
	for d := range shape {
		shape[d] = 1 + rng.Int63n(7)
		if rng.Intn(25) == 0 {
			shape[d] = 0
		}
	}
	es := int64(dt.Size())
	n, _ := ckpt.NumElements(shape)
	full := make([]byte, n*es)
	rng.Read(full)
	kind, boxes := chunking(rng, shape)
	if len(shape) > 0 && rng.Intn(3) == 0 { // an empty chunk anywhere, as torch writes them
		off := make([]int64, len(shape))
		size := make([]int64, len(shape))
		for d := range shape {
			off[d] = rng.Int63n(shape[d] + 1)
			size[d] = rng.Int63n(shape[d] - off[d] + 1)
		}
		size[rng.Intn(len(shape))] = 0
		boxes = append(boxes, [2][]int64{off, size})
	}
	rng.Shuffle(len(boxes), func(i, j int) { boxes[i], boxes[j] = boxes[j], boxes[i] })
	t := &ckpt.Tensor{Name: name, DType: dt, Shape: shape}
	for _, b := range boxes {
		t.Chunks.Append(ckpt.Chunk{Offsets: b[0], Sizes: b[1], Source: &treetest.MemSource{Data: extract(full, shape, es, b[0], b[1])}})
	}
	return t, full, fmt.Sprintf("%s %s%v %s", name, dt, shape, kind)
}

// TestViewAssemblyProperty plans views of random checkpoints (every dtype
// size, random shapes, every chunking ckptfs meets, several view files) and
// reads every view file back at random offsets and lengths: the bytes must
// be the header the file announces followed by each tensor's original bytes.
//
// On disk, the chunks lie in one file in a random order with random gaps,
// some tensors twice under two names, and reads merge across a random
// gap: the read plan's merging, scattering and overlaps are checked too.
func TestViewAssemblyProperty(t *testing.T) {
	for _, onDisk := range []bool{false, true} {
		t.Run(fmt.Sprintf("on disk %v", onDisk), func(t *testing.T) { checkAssembly(t, onDisk) })
	}
}

func checkAssembly(t *testing.T, onDisk bool) {
	rng := rand.New(rand.NewSource(11))
	for iter := range 300 {
		assembleOnce(t, rng, iter, onDisk)
	}
}

// FuzzViewAssembly is TestViewAssemblyProperty with the fuzzer choosing the
// random checkpoint, on disk or in memory.
func FuzzViewAssembly(f *testing.F) {
	for seed := range int64(8) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, seed int64) {
		assembleOnce(t, rand.New(rand.NewSource(seed)), 0, seed%2 == 0)
	})
}

// assembleOnce plans the view of one random checkpoint and reads it back.
func assembleOnce(t *testing.T, rng *rand.Rand, iter int, onDisk bool) {
	defer func(g int64) { mergeGap = g }(mergeGap)
	var dtypes []safetensors.DType
	for _, d := range []safetensors.DType{safetensors.BOOL, safetensors.U8, safetensors.I8, safetensors.F8_E4M3,
		safetensors.I16, safetensors.F16, safetensors.BF16, safetensors.I32, safetensors.F32,
		safetensors.I64, safetensors.F64, safetensors.C64} {
		require.Positive(t, d.Size(), d)
		dtypes = append(dtypes, d)
	}
	var tensors []*ckpt.Tensor
	originals := map[string][]byte{}
	var desc []string
	for k := range 1 + rng.Intn(5) {
		tn, full, d := randomTensor(rng, fmt.Sprintf("t%d", k), dtypes)
		tensors = append(tensors, tn)
		originals[tn.Name] = full
		desc = append(desc, d)
	}
	c := treetest.NewCheckpoint(t, t.TempDir(), tensors...)
	if onDisk {
		if rng.Intn(2) == 0 {
			twin := *tensors[0]
			twin.Name += "_twin"
			twin.Chunks = ckpt.MakeChunks(twin.Chunks.Values()...)
			c.Tensors = append(c.Tensors, &twin)
			originals[twin.Name] = originals[tensors[0].Name]
		}
		toDisk(t, rng, c)
		mergeGap = rng.Int63n(96)
	}
	v, err := Plan(c, Options{MaxShardSize: 1 + rng.Int63n(2048), NoMapping: true})
	require.NoError(t, err, "iteration %d: %v", iter, desc)
	for _, f := range v.Files {
		if f.Kind != KindSafetensors {
			continue
		}
		ref := make([]byte, f.Size)
		_, err := f.ReadAt(ref[:8], 0)
		require.NoError(t, err)
		headerSize := 8 + int64(binary.LittleEndian.Uint64(ref[:8]))
		require.LessOrEqual(t, headerSize, f.Size)
		_, err = f.ReadAt(ref[8:headerSize], 8)
		require.NoError(t, err)
		h, err := safetensors.ReadHeader(bytes.NewReader(ref), f.Size)
		require.NoError(t, err, "%s: header", f.Name)
		require.Len(t, h.Tensors, len(f.Placements()))
		for _, p := range f.Placements() {
			o := p.Origin()
			require.Len(t, o.Sources, 1)
			require.Empty(t, o.Transform)
			orig := originals[o.Sources[0]]
			require.Equal(t, p.Size, int64(len(orig)))
			copy(ref[p.Offset:], orig)
		}
		for range 40 {
			off := rng.Int63n(f.Size + 1)
			n := rng.Int63n(f.Size - off + 2) // sometimes one past the end
			got := make([]byte, n)
			k, err := f.ReadAt(got, off)
			want := ref[off:min(off+n, f.Size)]
			require.Equal(t, len(want), k, "iteration %d %s: ReadAt(%d, %d): %v (%v)", iter, f.Name, n, off, err, desc)
			if off+n > f.Size || off == f.Size { // io.ReaderAt allows EOF for an empty read at the end
				require.Equal(t, io.EOF, err)
			} else {
				require.NoError(t, err)
			}
			require.True(t, bytes.Equal(want, got[:k]), "iteration %d %s: bytes [%d, %d) differ (%v)", iter, f.Name, off, off+n, desc)
		}
	}
}

// toDisk moves every chunk of c out of memory into one file, in a random
// order with random gaps (often none) between them.
func toDisk(t *testing.T, rng *rand.Rand, c *ckpt.Checkpoint) {
	type chunk struct {
		tn *ckpt.Tensor
		i  int
	}
	var chunks []chunk
	for _, tn := range c.Tensors {
		for i := range tn.Chunks.Len() {
			chunks = append(chunks, chunk{tn, i})
		}
	}
	rng.Shuffle(len(chunks), func(i, j int) { chunks[i], chunks[j] = chunks[j], chunks[i] })
	var data []byte
	at := map[*treetest.MemSource]int64{}
	for _, ch := range chunks {
		m := ch.tn.Chunks.Source(ch.i).(*treetest.MemSource)
		if _, ok := at[m]; ok { // a twin's
			continue
		}
		if rng.Intn(2) == 0 {
			data = append(data, make([]byte, rng.Intn(80))...)
		}
		at[m] = int64(len(data))
		data = append(data, m.Data...)
	}
	require.NoError(t, os.WriteFile(filepath.Join(c.Dir, "shard"), data, 0o644))
	f, err := c.Files.Get("shard")
	require.NoError(t, err)
	for _, ch := range chunks {
		m := ch.tn.Chunks.Source(ch.i).(*treetest.MemSource)
		ch.tn.Chunks.SetSource(ch.i, &ckpt.Section{File: f, Offset: at[m], Length: int64(len(m.Data))})
	}
}
