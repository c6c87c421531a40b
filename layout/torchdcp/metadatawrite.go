package torchdcp

import (
	"io"

	"github.com/ckptfs/ckptfs/layout/pickle"
)

// EncodeMetadata writes m as the .metadata pickle torch >= 2.3 loads
// (FORMATS.md §2.6, §10): protocol 2, no memo, the root class
// torch.distributed.checkpoint.metadata.Metadata (m.Class and m.MCoreData
// are not written) with state_dict_metadata, planner_data, storage_data and,
// when set, version, in that order.
//
// TensorProperties get the 5-tuple state every torch >= 2.3 accepts (a 6th
// element, strides, breaks torch <= 2.14): 6 only for an entry decoded with
// strides. planner_data is None when m.Planner is nil; otherwise it covers
// every item, in item order (an item without a path gets (fqn,), which is
// how a flat key unflattens anyway, since dcp_to_torch_save needs a path for
// every key), then the entries that name no item. What PlannerErr reports
// is not written back.
func EncodeMetadata(w io.Writer, m *Metadata) error { return encodeMetadata(w, m, pickle.NewEncoder()) }

// encodeMetadata is EncodeMetadata with e (a memo encoder: a file of the
// shape torch writes, for tests and benchmarks).
func encodeMetadata(w io.Writer, m *Metadata, e *pickle.Encoder) error {
	e.Object(modMetadata, "Metadata", func() {
		e.Dict(func() {
			e.Str("state_dict_metadata")
			e.DictOf(len(m.Items), func(i int) {
				it := m.Items[i]
				e.Str(it.FQN)
				if it.Tensor == nil {
					e.Object(modMetadata, "BytesStorageMetadata", func() { e.Dict(nil) })
				} else {
					encodeTensor(e, it.Tensor)
				}
			})
			e.Str("planner_data")
			encodePlanner(e, m)
			e.Str("storage_data")
			pos := chunkPositions(m)
			e.DictOf(len(m.Storage), func(i int) {
				encodeIndex(e, m.Storage[i].Index, pos)
				encodeStorageInfo(e, m.Storage[i].Info)
			})
			if m.Version != "" {
				e.Str("version")
				e.Str(m.Version)
			}
		})
	})
	_, err := w.Write(e.Bytes())
	return err
}

func encodePlanner(e *pickle.Encoder, m *Metadata) {
	if m.Planner == nil {
		e.None()
		return
	}
	paths := make(map[string][]any, len(m.Planner))
	var extra []string // keys that name no item, in file order
	items := make(map[string]bool, len(m.Items))
	for _, it := range m.Items {
		items[it.FQN] = true
	}
	for _, p := range m.Planner {
		if _, dup := paths[p.Key]; !dup && !items[p.Key] {
			extra = append(extra, p.Key)
		}
		paths[p.Key] = p.Path
	}
	e.Dict(func() {
		for _, it := range m.Items {
			e.Str(it.FQN)
			path, ok := paths[it.FQN]
			if !ok {
				path = []any{it.FQN}
			}
			encodePath(e, path)
		}
		for _, k := range extra {
			e.Str(k)
			encodePath(e, paths[k])
		}
	})
}

func encodePath(e *pickle.Encoder, path []any) {
	e.Tuple(len(path), func() {
		for _, el := range path {
			switch x := el.(type) {
			case string:
				e.Str(x)
			case int64:
				e.Int(x)
			default:
				e.None() // not a path element; keeps the tuple's length
			}
		}
	})
}

// chunkPositions maps Index.Key → the chunk's position in its tensor, for
// MetadataIndex.index.
func chunkPositions(m *Metadata) map[string]int {
	pos := map[string]int{}
	for _, it := range m.Items {
		if it.Tensor == nil {
			continue
		}
		for i, c := range it.Tensor.Chunks {
			k := Index{FQN: it.FQN, Offset: c.Offsets}.Key()
			if _, ok := pos[k]; !ok {
				pos[k] = i
			}
		}
	}
	return pos
}

// encodeSize emits torch.Size((v...)).
func encodeSize(e *pickle.Encoder, v []int64) {
	e.Call("torch", "Size", 1, func() { e.IntTuple(v) })
}

func encodeTensor(e *pickle.Encoder, t *TensorMetadata) {
	e.Object(modMetadata, "TensorStorageMetadata", func() {
		e.Dict(func() {
			e.Str("properties")
			p := t.Properties
			e.Object(modMetadata, "TensorProperties", func() {
				n := 5
				if p.Strides != nil {
					n = 6
				}
				e.Tuple(n, func() {
					e.Global("torch", p.DType)
					layout := p.Layout
					if layout == "" {
						layout = "torch.strided"
					}
					e.Call("torch.serialization", "_get_layout", 1, func() { e.Str(layout) })
					e.Bool(p.RequiresGrad)
					e.Call(modMetadata, "_MEM_FORMAT_ENCODING", 1, func() { e.Int(p.MemoryFormat) })
					e.Bool(p.PinMemory)
					if p.Strides != nil {
						e.IntTuple(p.Strides)
					}
				})
			})
			e.Str("size")
			encodeSize(e, t.Size)
			e.Str("chunks")
			e.List(func() {
				for _, c := range t.Chunks {
					e.Object(modMetadata, "ChunkStorageMetadata", func() {
						e.Dict(func() {
							e.Str("offsets")
							encodeSize(e, c.Offsets)
							e.Str("sizes")
							encodeSize(e, c.Sizes)
						})
					})
				}
			})
		})
	})
}

// encodeIndex emits MetadataIndex with the state torch pickles: fqn, index,
// then offset only for tensor chunks.
func encodeIndex(e *pickle.Encoder, idx Index, pos map[string]int) {
	e.Object(modMetadata, "MetadataIndex", func() {
		e.Dict(func() {
			e.Str("fqn")
			e.NewStr(idx.FQN) // torch's is a new str for each
			e.Str("index")
			if i, ok := pos[idx.Key()]; ok && idx.Offset != nil {
				e.Int(int64(i))
			} else {
				e.None()
			}
			if idx.Offset != nil {
				e.Str("offset")
				encodeSize(e, idx.Offset)
			}
		})
	})
}

func encodeStorageInfo(e *pickle.Encoder, info StorageInfo) {
	e.Object(modFilesystem, "_StorageInfo", func() {
		e.Dict(func() {
			e.Str("relative_path")
			e.Str(info.RelativePath)
			e.Str("offset")
			e.Int(info.Offset)
			e.Str("length")
			e.Int(info.Length)
			if info.TransformDescriptors != nil {
				e.Str("transform_descriptors")
				e.List(func() {
					for _, d := range info.TransformDescriptors {
						e.Str(d)
					}
				})
			}
		})
	})
}
