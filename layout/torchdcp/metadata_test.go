package torchdcp

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/cost"
	"github.com/ckptfs/ckptfs/layout/pickle"
)

func decodeFile(t testing.TB, path string) (*Metadata, error) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return DecodeMetadata(bytes.NewReader(b))
}

func TestDecodeMetadataFixtures(t *testing.T) {
	man := loadManifest(t)
	for _, name := range checkpoints {
		t.Run(name, func(t *testing.T) {
			want := man.ckpt(t, name)
			m, err := decodeFile(t, filepath.Join("testdata", name, MetadataFile))
			require.NoError(t, err)
			assert.Equal(t, pickle.Global{Module: modMetadata, Name: "Metadata"}, m.Class)
			assert.Equal(t, want.Version, m.Version)
			assert.Nil(t, m.MCoreData)

			var tensors, objects []string
			for _, it := range m.Items {
				if it.Tensor == nil {
					objects = append(objects, it.FQN)
				} else {
					tensors = append(tensors, it.FQN)
				}
			}
			var wantTensors, wantObjects []string
			for _, wt := range want.Tensors {
				wantTensors = append(wantTensors, wt.FQN)
			}
			for _, wo := range want.Objects {
				wantObjects = append(wantObjects, wo.FQN)
				assert.Equal(t, wo.Path, m.PlannerData[wo.FQN], wo.FQN)
			}
			assert.Equal(t, wantTensors, tensors, "tensors in .metadata order")
			assert.Equal(t, wantObjects, objects)

			i := 0
			for _, it := range m.Items {
				if it.Tensor == nil {
					continue
				}
				wt := want.Tensors[i]
				i++
				assert.Equal(t, wt.DType, it.Tensor.Properties.DType, wt.FQN)
				assert.Equal(t, wt.RequiresGrad, it.Tensor.Properties.RequiresGrad, wt.FQN)
				assert.Equal(t, "torch.strided", it.Tensor.Properties.Layout)
				assert.Equal(t, int64(0), it.Tensor.Properties.MemoryFormat)
				assert.NotNil(t, it.Tensor.Properties.Strides, "torch 2.15 writes the 6-tuple with strides")
				assert.Equal(t, wt.Shape, nonNil(it.Tensor.Size), wt.FQN)
				require.Len(t, it.Tensor.Chunks, len(wt.Chunks), wt.FQN)
				for j, wc := range wt.Chunks {
					assert.Equal(t, wc.Offsets, nonNil(it.Tensor.Chunks[j].Offsets))
					assert.Equal(t, wc.Sizes, nonNil(it.Tensor.Chunks[j].Sizes))
				}
				assert.Equal(t, wt.Path, m.PlannerData[wt.FQN])
			}

			require.Len(t, m.Storage, len(want.Storage))
			for j, ws := range want.Storage {
				got := m.Storage[j]
				assert.Equal(t, ws.FQN, got.Index.FQN)
				if ws.Offset == nil {
					assert.Nil(t, got.Index.Offset, ws.FQN)
				} else {
					assert.Equal(t, ws.Offset, nonNil(got.Index.Offset), ws.FQN)
				}
				assert.Equal(t, ws.RelativePath, got.Info.RelativePath)
				assert.Equal(t, ws.FileOffset, got.Info.Offset)
				assert.Equal(t, ws.Length, got.Info.Length)
				assert.Equal(t, ws.TransformDescriptors, nonNilS(got.Info.TransformDescriptors))
				info, ok := m.Lookup(ws.FQN, got.Index.Offset)
				assert.True(t, ok)
				assert.Equal(t, got.Info, info)
			}
		})
	}
}

func nonNil(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}

func nonNilS(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func TestDecodeMetadataLegacyAndMCore(t *testing.T) {
	plain, err := decodeFile(t, filepath.Join("testdata", "plain", MetadataFile))
	require.NoError(t, err)
	for _, it := range plain.Items {
		if it.Tensor != nil {
			it.Tensor.Properties.Strides = nil
		}
	}

	legacy, err := decodeFile(t, filepath.Join("testdata", "plain_legacy.metadata"))
	require.NoError(t, err, "torch<=2.2 class path and 5-tuple state")
	assert.Equal(t, plain.Items, legacy.Items)
	assert.Equal(t, plain.Storage, legacy.Storage)
	assert.Equal(t, plain.PlannerData, legacy.PlannerData)

	mc, err := decodeFile(t, filepath.Join("testdata", "plain_mcore.metadata"))
	require.NoError(t, err)
	assert.Equal(t, pickle.Global{Module: modMCore, Name: "MCoreMetadata"}, mc.Class)
	require.NotNil(t, mc.MCoreData)
	v, ok := mc.MCoreData.Get("f32")
	require.True(t, ok)
	assert.Equal(t, `{"nd_reformulated_orig_global_shape": (3, 4)}`, pickle.Repr(v))
	for _, it := range mc.Items {
		if it.Tensor != nil {
			it.Tensor.Properties.Strides = nil
		}
	}
	assert.Equal(t, plain.Items, mc.Items)
	assert.Equal(t, plain.Storage, mc.Storage)
}

// mutate replaces old by new (same length) in a copy of the real plain
// .metadata.
func mutate(t testing.TB, old, new string) []byte {
	t.Helper()
	require.Equal(t, len(old), len(new))
	b, err := os.ReadFile(filepath.Join("testdata", "plain", MetadataFile))
	require.NoError(t, err)
	require.Contains(t, string(b), old)
	return bytes.Replace(b, []byte(old), []byte(new), 1)
}

func TestDecodeMetadataBad(t *testing.T) {
	real, err := os.ReadFile(filepath.Join("testdata", "plain", MetadataFile))
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		in   []byte
		err  string
	}{
		{"empty", nil, "pickle: truncated input"},
		{"truncated", real[:len(real)/2], "pickle: truncated input"},
		{"garbage", []byte("\xfe not a pickle"), "pickle: unknown opcode 0xfe at offset 0"},
		{"zip instead of pickle", []byte("PK\x03\x04"), "pickle: unsupported opcode PERSID"},
		{"not Metadata", []byte("\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R."),
			"field (root): expected torch.distributed.checkpoint.metadata.Metadata, got object os.system"},
		{"no state", []byte("\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81."), "field (root): torch.distributed.checkpoint.metadata.Metadata has no dict state"},
		{"deep nesting", []byte("\x80\x02" + strings.Repeat("]", 1000) + strings.Repeat("a", 999) + "."), "nested deeper than"},
		{"giant length", []byte("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f."), "exceeds the limit"},
		// A memo index of 4G: no memo or bitmap is sized by it.
		{"giant memo index", []byte("\x80\x04N\x94j\xff\xff\xff\xff."), "memo key 4294967295 not found"},
		// A list that grows by memo references to itself (a pickle has
		// no count to claim a billion chunks with; only the memo makes
		// more values than bytes): refused by the item bound.
		{"chunks by memo reference", []byte("\x80\x04]\x94(" + strings.Repeat("h\x00", 1000) + "e(" + strings.Repeat("h\x00", 1000) + "e."), "container items"},
		{"unknown entry class", mutate(t, "TensorStorageMetadata", "TensorStorageMetadatX"),
			`field state_dict_metadata["f32"]: expected TensorStorageMetadata or BytesStorageMetadata, got object torch.distributed.checkpoint.metadata.TensorStorageMetadatX`},
		{"unknown properties class", mutate(t, "TensorProperties", "TensorPropertieX"),
			`field state_dict_metadata["f32"].properties: expected TensorProperties`},
		{"missing relative_path", mutate(t, "relative_path", "relative_patX"), `field storage_data["step"].relative_path: missing`},
		{"unknown storage info class", mutate(t, "_StorageInfo", "_StorageInfX"), `expected _StorageInfo, got object`},
		{"unknown index class", mutate(t, "MetadataIndex", "MetadataIndeX"), `field storage_data[0].key: expected MetadataIndex`},
		{"Size is not torch.Size", mutate(t, "\x8c\x04Size", "\x8c\x04Sizf"), `.size: expected torch.Size, got object torch.Sizf`},
		{"missing chunks", mutate(t, "chunks", "chunkX"), `field state_dict_metadata["f32"].chunks: missing`},
		// Per-chunk and per-storage-entry fields are named only on error
		// (within): the names must still be whole.
		{"unknown chunk class", mutate(t, "ChunkStorageMetadata", "ChunkStorageMetadatX"),
			`field state_dict_metadata["f32"].chunks[0]: expected ChunkStorageMetadata, got object`},
		{"missing chunk offsets", mutate(t, "offsets", "offsetX"), `field state_dict_metadata["f32"].chunks[0].offsets: missing`},
		{"missing index fqn", mutate(t, "\x8c\x03fqn", "\x8c\x03fqX"), `field storage_data[0].key.fqn: missing`},
		{"missing storage length", mutate(t, "\x8c\x06length", "\x8c\x06lengtX"), `field storage_data["step"].length: missing`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := DecodeMetadata(bytes.NewReader(tc.in))
			require.Error(t, err, "decoded %+v", m)
			assert.ErrorContains(t, err, tc.err)
			assert.True(t, strings.HasPrefix(err.Error(), "torchdcp: .metadata: "), err.Error())
			assert.ErrorIs(t, err, ckpt.ErrInvalid)
			// Open's streaming decoder fails the same way, allocating
			// nothing sized by what the input claims.
			took := cost.Of(func() { checkStream(t, tc.in) })
			assert.Less(t, took.Alloc, uint64(4*len(tc.in)+(8<<20)), "bytes allocated")
		})
	}
}

// FuzzDecodeMetadata is seeded with every .metadata in testdata (this
// package's and the repository's, written by real torch and megatron-core)
// and the hostile ones.
func FuzzDecodeMetadata(f *testing.F) {
	seeds := []string{filepath.Join("testdata", "plain_legacy.metadata"), filepath.Join("testdata", "plain_mcore.metadata"), memoBombFile}
	for _, dir := range fixtureCheckpoints(f) {
		seeds = append(seeds, filepath.Join(dir, MetadataFile))
	}
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeMetadata(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ckpt.ErrInvalid) {
				t.Fatalf("error not marked ErrInvalid: %v", err)
			}
			return
		}
		for i, e := range m.Storage {
			if _, ok := m.Lookup(e.Index.FQN, e.Index.Offset); !ok {
				t.Fatalf("storage entry %s not found by Lookup", e.Index)
			}
			// Every hint finds what the index finds (see lookupFrom).
			for _, hint := range []int{i, i - 1, i + 1, 0} {
				if j, ok := m.lookupFrom(hint, e.Index.FQN, e.Index.Offset); !ok || j != i {
					t.Fatalf("storage entry %d %s found at %d (%v) with hint %d", i, e.Index, j, ok, hint)
				}
			}
		}
		checkReencode(t, m)
	})
}

// lookupFrom finds what the index finds whatever the hint, including
// entries whose keys differ only by a nil or empty offset.
func TestLookupFromHint(t *testing.T) {
	entry := func(fqn string, off []int64, n int64) StorageEntry {
		return StorageEntry{Index: Index{FQN: fqn, Offset: off}, Info: StorageInfo{RelativePath: "f", Offset: n}}
	}
	m := (&Metadata{}).With(nil, nil, []StorageEntry{
		entry("a", []int64{0, 0}, 1), entry("a", []int64{1, 0}, 2), entry("a", nil, 3),
		entry("a", []int64{}, 4), entry("b", []int64{0, 0}, 5), entry("a", []int64{1, 0}, 6),
	})
	require.Len(t, m.Storage, 5)
	keys := []Index{{"a", []int64{0, 0}}, {"a", []int64{1, 0}}, {"a", nil}, {"a", []int64{}},
		{"b", []int64{0, 0}}, {"b", nil}, {"c", []int64{0, 0}}, {"a", []int64{0}}}
	for _, k := range keys {
		want, wantOK := m.lookupFrom(-1, k.FQN, k.Offset)
		for hint := -1; hint <= len(m.Storage)+1; hint++ {
			got, ok := m.lookupFrom(hint, k.FQN, k.Offset)
			require.Equal(t, wantOK, ok, "%v hint %d", k, hint)
			if ok {
				require.Equal(t, want, got, "%v hint %d", k, hint)
			}
		}
	}
	// A hand-made Metadata has no index: nothing is found, hint or not.
	h := &Metadata{Storage: m.Storage}
	_, ok := h.lookupFrom(0, "a", []int64{0, 0})
	require.False(t, ok)
}
