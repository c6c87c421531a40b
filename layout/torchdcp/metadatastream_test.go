package torchdcp

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// streamSeeds are .metadata files written by real torch and megatron-core,
// and the hostile ones.
func streamSeeds(t testing.TB) []string {
	seeds := []string{filepath.Join("testdata", "plain_legacy.metadata"), filepath.Join("testdata", "plain_mcore.metadata"), memoBombFile}
	for _, dir := range fixtureCheckpoints(t) {
		seeds = append(seeds, filepath.Join(dir, MetadataFile))
	}
	return seeds
}

// checkStream decodes data both ways and checks that the stream says what
// the general decoder says: the same error, or the same items and the
// storage of every chunk and object. It reports whether the stream took
// the file (rather than handing it to the general decoder).
func checkStream(t testing.TB, data []byte) bool {
	want, werr := decodeMetadataBytes(data, DefaultMaxMetadataBytes)
	got, st, err := decodeMetadataStream(data, DefaultMaxMetadataBytes)
	if werr != nil {
		require.EqualError(t, err, werr.Error())
		return false
	}
	require.NoError(t, err)
	require.Equal(t, len(want.Items), len(got.Items))
	for i, w := range want.Items {
		g := got.Items[i]
		require.Equal(t, w.FQN, g.FQN)
		require.Equal(t, w.Tensor == nil, g.Tensor == nil, w.FQN)
		if w.Tensor == nil {
			wi, wok := want.Lookup(w.FQN, nil)
			gi, gok := wi, wok
			if st != nil {
				gi, gok = st.lookup(w.FQN, -1)
			}
			require.Equal(t, wok, gok, w.FQN)
			require.Equal(t, wi, gi, w.FQN)
			continue
		}
		require.Equal(t, w.Tensor.Properties, g.Tensor.Properties, w.FQN)
		require.Equal(t, w.Tensor.Size, g.Tensor.Size, w.FQN)
		require.Equal(t, len(w.Tensor.Chunks), g.Tensor.numChunks(), w.FQN)
		for j, wc := range w.Tensor.Chunks {
			goff, gsz := g.Tensor.chunk(j)
			require.Equal(t, wc.Offsets, goff, "%s chunk %d", w.FQN, j)
			require.Equal(t, wc.Sizes, gsz, "%s chunk %d", w.FQN, j)
			wi, wok := want.Lookup(w.FQN, wc.Offsets)
			gi, gok := got.Lookup(w.FQN, goff)
			if st != nil {
				gi, gok = st.lookup(w.FQN, j)
			}
			require.Equal(t, wok, gok, "%s chunk %d", w.FQN, j)
			require.Equal(t, wi, gi, "%s chunk %d", w.FQN, j)
		}
	}
	require.Equal(t, want.Planner, got.Planner)
	require.Equal(t, want.PlannerData, got.PlannerData)
	require.Equal(t, want.Version, got.Version)
	require.Equal(t, want.Class, got.Class)
	return st != nil
}

// Every .metadata real torch and megatron-core wrote is taken by the
// stream (none falls back to the general decoder), which finds what the
// general decoder finds.
func TestStreamMatchesDecode(t *testing.T) {
	for _, p := range streamSeeds(t) {
		t.Run(p, func(t *testing.T) {
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			took := checkStream(t, b)
			if p != memoBombFile {
				require.True(t, took, "the stream handed %s to the general decoder", p)
			}
		})
	}
}

// FuzzDecodeMetadataStream: whatever the input, the stream decodes it to
// what the general decoder does, or fails with its error.
func FuzzDecodeMetadataStream(f *testing.F) {
	for _, p := range streamSeeds(f) {
		b, err := os.ReadFile(p)
		require.NoError(f, err)
		if len(b) <= 64<<10 { // the fuzzer mutates small inputs quickly
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkStream(t, data)
	})
}
