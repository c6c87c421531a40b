package torchdcp

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/pickle"
)

// recordMetadata encodes the .metadata of one [4, 2] tensor "w" in two
// chunks, whose ChunkStorageMetadata, MetadataIndex and _StorageInfo
// states are written by chunk, index and info (i: the chunk).
func recordMetadata(chunk, index, info func(e *pickle.Encoder, i int64)) []byte {
	e := pickle.NewEncoder()
	e.Object(modMetadata, "Metadata", func() {
		e.Dict(func() {
			e.Str("state_dict_metadata")
			e.Dict(func() {
				e.Str("w")
				e.Object(modMetadata, "TensorStorageMetadata", func() {
					e.Dict(func() {
						encodeFloat32Head(e, []int64{4, 2})
						e.Str("chunks")
						e.List(func() {
							for i := range int64(2) {
								e.Object(modMetadata, "ChunkStorageMetadata", func() { e.Dict(func() { chunk(e, i) }) })
							}
						})
					})
				})
			})
			e.Str("storage_data")
			e.Dict(func() {
				for i := range int64(2) {
					e.Object(modMetadata, "MetadataIndex", func() { e.Dict(func() { index(e, i) }) })
					e.Object(modFilesystem, "_StorageInfo", func() { e.Dict(func() { info(e, i) }) })
				}
			})
		})
	})
	return e.Bytes()
}

func chunkFields(e *pickle.Encoder, i int64) {
	e.Str("offsets")
	encodeSize(e, []int64{2 * i, 0})
	e.Str("sizes")
	encodeSize(e, []int64{2, 2})
}

func indexFields(e *pickle.Encoder, i int64) {
	e.Str("fqn")
	e.Str("w")
	e.Str("offset")
	encodeSize(e, []int64{2 * i, 0})
	e.Str("index")
	e.None()
}

func infoFields(e *pickle.Encoder, i int64) {
	e.Str("relative_path")
	e.Str("__0_0.distcp")
	e.Str("offset")
	e.Int(100 * i)
	e.Str("length")
	e.Int(100)
}

// Records of every field shape the general decoders read, and of shapes
// they read differently or refuse: the stream with records says what the
// general decoder says, word for word (checkStream), and takes as records
// exactly the well-formed ones.
func TestStreamRecordFields(t *testing.T) {
	with := func(base func(*pickle.Encoder, int64), extra func(e *pickle.Encoder)) func(*pickle.Encoder, int64) {
		return func(e *pickle.Encoder, i int64) { base(e, i); extra(e) }
	}
	size := func(module, name string, v ...int64) func(e *pickle.Encoder) {
		return func(e *pickle.Encoder) { e.Call(module, name, 1, func() { e.IntTuple(v) }) }
	}
	for _, tc := range []struct {
		name               string
		chunk, index, info func(*pickle.Encoder, int64)
		records            int // taken as records; -1: the file fails
	}{
		{"well-formed", chunkFields, indexFields, infoFields, 6},
		{"chunk offsets a bare tuple", func(e *pickle.Encoder, i int64) {
			e.Str("offsets")
			e.IntTuple([]int64{2 * i, 0})
			e.Str("sizes")
			encodeSize(e, []int64{2, 2})
		}, indexFields, infoFields, 6},
		{"chunk offsets another class", func(e *pickle.Encoder, i int64) {
			e.Str("offsets")
			size("torch", "Sizf", 2*i, 0)(e)
			e.Str("sizes")
			encodeSize(e, []int64{2, 2})
		}, indexFields, infoFields, -1},
		{"chunk offsets a list of ints", func(e *pickle.Encoder, i int64) {
			e.Str("offsets")
			e.List(func() { e.Int(2 * i); e.Int(0) })
			e.Str("sizes")
			encodeSize(e, []int64{2, 2})
		}, indexFields, infoFields, 4},
		{"chunk offsets a bool", func(e *pickle.Encoder, i int64) {
			e.Str("offsets")
			e.Tuple(2, func() { e.Bool(true); e.Int(0) })
			e.Str("sizes")
			encodeSize(e, []int64{2, 2})
		}, indexFields, infoFields, -1},
		{"chunk ranks differ", func(e *pickle.Encoder, i int64) {
			e.Str("offsets")
			encodeSize(e, []int64{2 * i})
			e.Str("sizes")
			encodeSize(e, []int64{2, 2})
		}, indexFields, infoFields, -1},
		{"chunk sizes missing", func(e *pickle.Encoder, i int64) {
			e.Str("offsets")
			encodeSize(e, []int64{2 * i, 0})
		}, indexFields, infoFields, -1},
		{"chunk sizes set twice", with(chunkFields, func(e *pickle.Encoder) {
			e.Str("sizes")
			encodeSize(e, []int64{2, 2})
		}), indexFields, infoFields, 6},
		{"chunk with an unknown tuple field", with(chunkFields, func(e *pickle.Encoder) {
			e.Str("x")
			e.Tuple(0, nil)
		}), indexFields, infoFields, 6},
		{"chunk with an unknown bool field", with(chunkFields, func(e *pickle.Encoder) {
			e.Str("x")
			e.Bool(true)
		}), indexFields, infoFields, 4},
		{"index offset None", chunkFields, func(e *pickle.Encoder, i int64) {
			e.Str("fqn")
			e.Str("w")
			e.Str("offset")
			e.None()
		}, infoFields, 6},
		{"index fqn an int", chunkFields, func(e *pickle.Encoder, i int64) {
			e.Str("fqn")
			e.Int(1)
		}, infoFields, -1},
		{"index offset a tuple", chunkFields, func(e *pickle.Encoder, i int64) {
			e.Str("fqn")
			e.Str("w")
			e.Str("offset")
			e.IntTuple([]int64{2 * i, 0})
		}, infoFields, 6},
		{"index offset an int", chunkFields, func(e *pickle.Encoder, i int64) {
			e.Str("fqn")
			e.Str("w")
			e.Str("offset")
			e.Int(2 * i)
		}, infoFields, -1},
		{"index fqn missing", chunkFields, func(e *pickle.Encoder, i int64) {
			e.Str("offset")
			encodeSize(e, []int64{2 * i, 0})
		}, infoFields, -1},
		{"chunk offsets missing", func(e *pickle.Encoder, i int64) {
			e.Str("sizes")
			encodeSize(e, []int64{2, 2})
		}, indexFields, infoFields, -1},
		{"chunk offsets missing, sizes ()", func(e *pickle.Encoder, i int64) {
			e.Str("sizes")
			encodeSize(e, []int64{})
		}, indexFields, infoFields, -1},
		{"info relative_path missing", chunkFields, indexFields, func(e *pickle.Encoder, i int64) {
			e.Str("offset")
			e.Int(100 * i)
			e.Str("length")
			e.Int(100)
		}, -1},
		{"info fields in another order", chunkFields, indexFields, func(e *pickle.Encoder, i int64) {
			e.Str("length")
			e.Int(100)
			e.Str("offset")
			e.Int(100 * i)
			e.Str("relative_path")
			e.Str("__0_0.distcp")
		}, 6},
		{"info offset a str", chunkFields, indexFields, func(e *pickle.Encoder, i int64) {
			e.Str("relative_path")
			e.Str("__0_0.distcp")
			e.Str("offset")
			e.Str("0")
			e.Str("length")
			e.Int(100)
		}, -1},
		{"info length missing", chunkFields, indexFields, func(e *pickle.Encoder, i int64) {
			e.Str("relative_path")
			e.Str("__0_0.distcp")
			e.Str("offset")
			e.Int(0)
		}, -1},
		{"info transforms empty", chunkFields, indexFields, with(infoFields, func(e *pickle.Encoder) {
			e.Str("transform_descriptors")
			e.List(nil)
		}), 6},
		{"info transforms", chunkFields, indexFields, with(infoFields, func(e *pickle.Encoder) {
			e.Str("transform_descriptors")
			e.List(func() { e.Str("stream.zstd/1"); e.Str("x") })
		}), 6},
		{"info transforms a tuple", chunkFields, indexFields, with(infoFields, func(e *pickle.Encoder) {
			e.Str("transform_descriptors")
			e.Tuple(1, func() { e.Str("stream.zstd/1") })
		}), 4},
		{"info transforms None", chunkFields, indexFields, with(infoFields, func(e *pickle.Encoder) {
			e.Str("transform_descriptors")
			e.None()
		}), 6},
		{"info transforms of ints", chunkFields, indexFields, with(infoFields, func(e *pickle.Encoder) {
			e.Str("transform_descriptors")
			e.List(func() { e.Int(1) })
		}), -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := checkStream(t, recordMetadata(tc.chunk, tc.index, tc.info))
			if tc.records < 0 {
				require.Nil(t, st, "the file decodes")
				return
			}
			require.NotNil(t, st)
			require.Equal(t, tc.records, st.records, "taken as records")
			require.Equal(t, 6-tc.records, st.built, "built as objects")
		})
	}
}

// encodeFloat32Head writes a contiguous float32 TensorStorageMetadata's
// "properties" and "size" entries.
func encodeFloat32Head(e *pickle.Encoder, size []int64) {
	e.Str("properties")
	e.Object(modMetadata, "TensorProperties", func() {
		e.Tuple(5, func() {
			e.Global("torch", "float32")
			e.Call("torch.serialization", "_get_layout", 1, func() { e.Str("torch.strided") })
			e.Bool(false)
			e.Call(modMetadata, "_MEM_FORMAT_ENCODING", 1, func() { e.Int(0) })
			e.Bool(false)
		})
	})
	e.Str("size")
	encodeSize(e, size)
}
