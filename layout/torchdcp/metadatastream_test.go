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

// checkStream decodes data the general way and through the stream, with
// records (pickle.RecordSink) and without, and checks that the stream says
// what the general decoder says: the same error, or the same items and the
// storage of every chunk and object. It returns the stream with records if
// it took the file (rather than handing it to the general decoder).
func checkStream(t testing.TB, data []byte) *stream {
	plain := newStream()
	plain.noRecords = true
	tookPlain := checkStreamWith(t, data, plain)
	st := newStream()
	took := checkStreamWith(t, data, st)
	require.Equal(t, tookPlain, took, "the stream took the file with records, or without")
	if !took {
		return nil
	}
	require.Zero(t, plain.records)
	require.Equal(t, plain.built, st.built+st.records, "chunks, indexes and storage infos taken")
	return st
}

func checkStreamWith(t testing.TB, data []byte, s *stream) bool {
	want, werr := decodeMetadataBytes(data, DefaultMaxMetadataBytes)
	got, st, err := decodeMetadataStream(data, DefaultMaxMetadataBytes, s)
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

// sharesChunks are the .metadata files whose ChunkStorageMetadata objects
// are got again through the memo (an early megatron-core's mcore_data holds
// its WriteItems, each with its chunk): those the VM builds, as the memo
// needs them whole.
var sharesChunks = map[string]bool{"../../testdata/megatron/ckpt/.metadata": true}

// Every .metadata real torch and megatron-core wrote is taken by the
// stream (none falls back to the general decoder), which finds what the
// general decoder finds; every chunk, index and storage info in it is read
// as a record, without being built.
func TestStreamMatchesDecode(t *testing.T) {
	for _, p := range streamSeeds(t) {
		t.Run(p, func(t *testing.T) {
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			st := checkStream(t, b)
			if p != memoBombFile {
				require.NotNil(t, st, "the stream handed %s to the general decoder", p)
				require.Positive(t, st.records)
				if !sharesChunks[p] {
					require.Zero(t, st.built, "chunks, indexes and storage infos built as objects")
				}
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
		// Storage entries placed in batches of one to three, or many.
		defer func(n int) { batchLen = n }(batchLen)
		batchLen = []int{1, 2, 3, batchLen}[len(data)%4]
		checkStream(t, data)
	})
}
