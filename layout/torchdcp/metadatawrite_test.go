package torchdcp

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkReencode encodes m, decodes the result and checks that it says what
// m says: the same items, storage and version, and every planner path of m
// (planner_data is written for every item, so items without a path gain
// (fqn,)). The root class and mcore_data are not written.
func checkReencode(t *testing.T, m *Metadata) {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, EncodeMetadata(&buf, m))
	got, err := DecodeMetadata(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err, "re-decoding the encoded .metadata")
	require.Equal(t, "Metadata", got.Class.Name)
	require.Equal(t, m.Items, got.Items)
	if len(m.Storage) > 0 { // storage_data None is written as {}
		require.Equal(t, m.Storage, got.Storage)
	} else {
		require.Empty(t, got.Storage)
	}
	require.Equal(t, m.Version, got.Version)
	require.NoError(t, got.PlannerErr)
	if m.Planner == nil {
		require.Nil(t, got.Planner)
		return
	}
	for k, path := range m.PlannerData {
		require.Equal(t, path, got.PlannerData[k], "planner_data[%q]", k)
	}
	for _, it := range m.Items {
		if _, ok := m.PlannerData[it.FQN]; !ok {
			require.Equal(t, []string{it.FQN}, got.PlannerData[it.FQN], "planner_data[%q]", it.FQN)
		}
	}
}

// TestEncodeMetadataFixtures: every .metadata torch and megatron-core wrote
// in testdata decodes, encodes and decodes again to what it said.
func TestEncodeMetadataFixtures(t *testing.T) {
	paths := []string{filepath.Join("testdata", "plain_legacy.metadata"), filepath.Join("testdata", "plain_mcore.metadata")}
	for _, name := range checkpoints {
		paths = append(paths, filepath.Join("testdata", name, MetadataFile))
	}
	for _, dir := range fixtureCheckpoints(t) {
		paths = append(paths, filepath.Join(dir, MetadataFile))
	}
	for _, p := range paths {
		t.Run(p, func(t *testing.T) {
			m, err := decodeFile(t, p)
			require.NoError(t, err)
			checkReencode(t, m)
		})
	}
}

// TestEncodeMetadataPlanner: planner_data keeps int path elements, items
// without a path get (fqn,), keys that name no item come last, and a nil
// Planner is None.
func TestEncodeMetadataPlanner(t *testing.T) {
	item := func(fqn string) Item {
		return Item{FQN: fqn, Tensor: &TensorMetadata{Properties: TensorProperties{DType: "float32", Layout: "torch.strided"},
			Size: []int64{2}, Chunks: []ChunkMetadata{{Offsets: []int64{0}, Sizes: []int64{2}}}}}
	}
	m := (&Metadata{}).With([]Item{item("a.b"), item("o.0.lr"), {FQN: "obj"}},
		[]PlannerEntry{{"extra", []any{"x"}}, {"o.0.lr", []any{"o", int64(0), "lr"}}, {"a.b", []any{"a", "b"}}},
		[]StorageEntry{
			{Index{FQN: "a.b", Offset: []int64{0}}, StorageInfo{RelativePath: "__0_0.distcp", Length: 8}},
			{Index{FQN: "o.0.lr", Offset: []int64{0}}, StorageInfo{RelativePath: "__0_0.distcp", Offset: 8, Length: 8}},
			{Index{FQN: "obj"}, StorageInfo{RelativePath: "__0_0.distcp", Offset: 16, Length: 3, TransformDescriptors: []string{"stream.zstd/1"}}},
		})
	var buf bytes.Buffer
	require.NoError(t, EncodeMetadata(&buf, m))
	got, err := DecodeMetadata(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	var keys []string
	for _, p := range got.Planner {
		keys = append(keys, p.Key)
	}
	assert.Equal(t, []string{"a.b", "o.0.lr", "obj", "extra"}, keys)
	assert.Equal(t, []any{"o", int64(0), "lr"}, got.Planner[1].Path)
	assert.Equal(t, []any{"obj"}, got.Planner[2].Path)
	info, ok := got.Lookup("obj", nil)
	require.True(t, ok)
	assert.Equal(t, []string{"stream.zstd/1"}, info.TransformDescriptors)

	// With replaces an entry with the same key and leaves m alone.
	m2 := m.With(nil, nil, []StorageEntry{{Index{FQN: "obj"}, StorageInfo{RelativePath: "__1_0.distcp"}}})
	info, _ = m2.Lookup("obj", nil)
	assert.Equal(t, "__1_0.distcp", info.RelativePath)
	info, _ = m.Lookup("obj", nil)
	assert.Equal(t, "__0_0.distcp", info.RelativePath)
	assert.Len(t, m2.Storage, 3)

	buf.Reset()
	require.NoError(t, EncodeMetadata(&buf, &Metadata{Items: []Item{item("w")}}))
	got, err = DecodeMetadata(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	assert.Nil(t, got.Planner, "None")
}
