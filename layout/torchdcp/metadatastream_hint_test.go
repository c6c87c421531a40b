package torchdcp

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/pickle"
)

// hintMetadata encodes the .metadata of one [8, 2] tensor "w" whose chunks
// are the rows rows[i]..+2, and one storage entry per entries[i]: the
// chunk of row entries[i].row, its MetadataIndex.index written by hint.
func hintMetadata(rows []int64, entries []hintEntry) []byte {
	return recordMetadataOf(rows, func(e *pickle.Encoder) {
		for i, en := range entries {
			e.Object(modMetadata, "MetadataIndex", func() {
				e.Dict(func() {
					e.Str("fqn")
					e.Str("w")
					e.Str("offset")
					encodeSize(e, []int64{en.row, 0})
					if en.hint != nil {
						e.Str("index")
						en.hint(e)
					}
				})
			})
			e.Object(modFilesystem, "_StorageInfo", func() { e.Dict(func() { infoFields(e, int64(i)) }) })
		}
	})
}

type hintEntry struct {
	row  int64
	hint func(e *pickle.Encoder)
}

// recordMetadataOf is recordMetadata's file with chunks at rows and the
// storage entries storage writes.
func recordMetadataOf(rows []int64, storage func(e *pickle.Encoder)) []byte {
	e := pickle.NewEncoder()
	e.Object(modMetadata, "Metadata", func() {
		e.Dict(func() {
			e.Str("state_dict_metadata")
			e.Dict(func() {
				e.Str("w")
				e.Object(modMetadata, "TensorStorageMetadata", func() {
					e.Dict(func() {
						encodeFloat32Head(e, []int64{8, 2})
						e.Str("chunks")
						e.List(func() {
							for _, r := range rows {
								e.Object(modMetadata, "ChunkStorageMetadata", func() {
									e.Dict(func() {
										e.Str("offsets")
										encodeSize(e, []int64{r, 0})
										e.Str("sizes")
										encodeSize(e, []int64{2, 2})
									})
								})
							}
						})
					})
				})
			})
			e.Str("storage_data")
			e.Dict(func() { storage(e) })
		})
	})
	return e.Bytes()
}

// A storage entry's MetadataIndex.index places it with one comparison
// when right; a wrong, absent, out-of-range or ill-typed one, or one among
// repeated chunks, places it where the general decoder does (checkStream:
// every chunk's storage, word for word), with records and as objects.
func TestStreamIndexHint(t *testing.T) {
	at := func(i int64) func(e *pickle.Encoder) { return func(e *pickle.Encoder) { e.Int(i) } }
	none := func(e *pickle.Encoder) { e.None() }
	inOrder := []int64{0, 2, 4, 6}
	for _, tc := range []struct {
		name    string
		rows    []int64
		entries []hintEntry
		hinted  int // entries placed by their hint
	}{
		{"right", inOrder, []hintEntry{{0, at(0)}, {2, at(1)}, {4, at(2)}, {6, at(3)}}, 4},
		{"right, entries out of order", inOrder, []hintEntry{{6, at(3)}, {0, at(0)}, {4, at(2)}, {2, at(1)}}, 4},
		{"chunks out of order", []int64{4, 0, 6, 2}, []hintEntry{{4, at(0)}, {0, at(1)}, {6, at(2)}, {2, at(3)}}, 4},
		{"absent", inOrder, []hintEntry{{0, nil}, {2, nil}, {4, nil}, {6, nil}}, 0},
		{"None", inOrder, []hintEntry{{0, none}, {2, none}, {4, none}, {6, none}}, 0},
		{"swapped", inOrder, []hintEntry{{0, at(1)}, {2, at(0)}, {4, at(3)}, {6, at(2)}}, 0},
		{"all 0", inOrder, []hintEntry{{0, at(0)}, {2, at(0)}, {4, at(0)}, {6, at(0)}}, 1},
		{"out of range", inOrder, []hintEntry{{0, at(4)}, {2, at(-1)}, {4, at(1 << 62)}, {6, at(-1 << 62)}}, 0},
		{"a str, a bool", inOrder, []hintEntry{
			{0, func(e *pickle.Encoder) { e.Str("0") }},
			{2, func(e *pickle.Encoder) { e.Bool(true) }},
			{4, at(2)},
			{6, at(3)},
		}, 2},
		{"a row no chunk has", inOrder, []hintEntry{{0, at(0)}, {1, at(0)}, {2, at(1)}}, 2},
		{"an entry twice", inOrder, []hintEntry{{0, at(0)}, {2, at(1)}, {2, at(1)}, {6, at(3)}}, 4},
		// The same key (torch compares fqn and offset, not index) twice,
		// one hint wrong: the later entry's storage is the chunk's.
		{"an entry twice, right then wrong", inOrder, []hintEntry{{2, at(1)}, {0, at(0)}, {2, at(3)}}, 2},
		{"an entry twice, wrong then right", inOrder, []hintEntry{{2, at(3)}, {0, at(0)}, {2, at(1)}}, 2},
		// Repeated chunks: each entry names every chunk of its offsets,
		// as the general decoder's lookup finds the one entry for both.
		{"repeated chunks", []int64{0, 2, 2, 6}, []hintEntry{{0, at(0)}, {2, at(1)}, {2, at(2)}, {6, at(3)}}, 0},
		{"repeated chunks out of order", []int64{6, 2, 0, 2}, []hintEntry{{6, at(0)}, {2, at(3)}, {0, at(2)}}, 0},
		{"repeated chunks, fewer entries", []int64{0, 0, 0, 0}, []hintEntry{{0, at(2)}}, 0},
	} {
		// Entries placed in batches of one, two and many (flush).
		for _, n := range []int{1, 2, batchLen} {
			t.Run(fmt.Sprintf("%s, batches of %d", tc.name, n), func(t *testing.T) {
				defer func(n int) { batchLen = n }(batchLen)
				batchLen = n
				st := checkStream(t, hintMetadata(tc.rows, tc.entries))
				require.NotNil(t, st, "the stream handed the file to the general decoder")
				require.Equal(t, tc.hinted, st.hinted, "entries placed by their hint")
			})
		}
	}
}

// A storage entry's fqn, pickled in full, is its tensor's name (the same
// string, boxed once) when a tensor has it: found as the tensor Str found
// last, the one found after it last time, or by the map; else the VM's
// own. put takes the tensor Str found only if its name is the entry's.
func TestStreamStr(t *testing.T) {
	s := newStream()
	var ts []*streamTensor
	for _, name := range []string{"a", "b", "c"} {
		st := &streamTensor{t: &TensorMetadata{}}
		_, err := s.SetItem(nil, name, tensorRef{st})
		require.NoError(t, err)
		ts = append(ts, st)
	}
	str := func(name string) {
		box := s.Str([]byte(name))
		require.NotNil(t, box, name)
		require.Equal(t, name, box.(string))
		require.Same(t, s.byFQN[name], s.named, name)
	}
	for range 2 { // two "ranks"
		str("a")
		str("b")
		str("c")
	}
	require.Same(t, ts[1], ts[0].after)
	require.Same(t, ts[2], ts[1].after)
	require.Same(t, ts[0], ts[2].after)
	require.Nil(t, s.Str([]byte("d")))
	require.Nil(t, s.Str([]byte("")))
	str("c") // the last one again
	str("b") // by the map
	require.Same(t, ts[1], ts[2].after)

	// Once the stream has tensors, their names are laid out in one
	// string, in order (pack), and found as before.
	s.tensors = ts
	str("c")
	require.Equal(t, 3, s.packed)
	for i, name := range []string{"a", "b", "c"} {
		require.Equal(t, name, ts[i].fqn)
		require.Equal(t, name, ts[i].box)
		require.Equal(t, unsafe.Add(unsafe.Pointer(unsafe.StringData(ts[0].fqn)), i),
			unsafe.Pointer(unsafe.StringData(ts[i].fqn)), "%s: right after the name before it", name)
	}
	str("a")
	str("b")

	for _, e := range []streamEntry{
		{idx: Index{FQN: "a", Offset: []int64{}}, t: ts[0]},
		{idx: Index{FQN: "a", Offset: []int64{}}, t: ts[2]}, // not its tensor
		{idx: Index{FQN: "b", Offset: []int64{}}},
	} {
		require.True(t, s.put(e))
		require.Same(t, s.byFQN[e.idx.FQN], s.last)
	}
}
