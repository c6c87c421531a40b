package dcpwrite

import (
	"fmt"
	"strconv"

	"github.com/ckptfs/ckptfs/layout/pickle"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
)

// Class paths the writer emits (FORMATS.md §2.2, torch >= 2.3).
const (
	modMetadata   = "torch.distributed.checkpoint.metadata"
	modFilesystem = "torch.distributed.checkpoint.filesystem"
)

// metadata is the committed state of a directory: what .metadata holds, in
// the form the emitter needs. Entries and storage keep file order; new
// commits append.
type metadata struct {
	entries []entry
	// planner maps fqn → path (elements string or int64). nil: planner_data
	// is None (only while there are no entries without one).
	planner map[string][]any
	// plannerExtra are planner_data keys that name no entry, kept in order.
	plannerExtra []string
	storage      []storageEntry
	version      string // "" = omitted
}

// entry is one state_dict_metadata item; tensor == nil for BYTE_IO.
type entry struct {
	fqn    string
	tensor *tensorMeta
}

type tensorMeta struct {
	dtype        string // torch name
	layout       string // "torch.strided"
	requiresGrad bool
	memoryFormat int64
	pinMemory    bool
	// strides is the 6th state element torch >= 2.15 writes; kept for
	// entries decoded with one, never emitted for new ones (a 6-tuple
	// breaks torch <= 2.14).
	strides []int64
	size    []int64
	chunks  []torchdcp.ChunkMetadata
}

type storageEntry struct {
	fqn    string
	offset []int64 // nil for BYTE_IO
	info   torchdcp.StorageInfo
}

// fromDecoded converts a decoded .metadata. planner_data comes from its raw
// form: an int path element must stay an int (it is a list index).
func fromDecoded(m *torchdcp.Metadata) (*metadata, error) {
	if m.Class.Name != "Metadata" {
		return nil, fmt.Errorf("%w: root class %s (its extra fields would be lost on rewrite)", ErrUnsupported, m.Class)
	}
	out := &metadata{version: m.Version}
	for _, it := range m.Items {
		e := entry{fqn: it.FQN}
		if t := it.Tensor; t != nil {
			e.tensor = &tensorMeta{
				dtype:        t.Properties.DType,
				layout:       t.Properties.Layout,
				requiresGrad: t.Properties.RequiresGrad,
				memoryFormat: t.Properties.MemoryFormat,
				pinMemory:    t.Properties.PinMemory,
				strides:      t.Properties.Strides,
				size:         t.Size,
				chunks:       t.Chunks,
			}
		}
		out.entries = append(out.entries, e)
	}
	for _, s := range m.Storage {
		out.storage = append(out.storage, storageEntry{fqn: s.Index.FQN, offset: s.Index.Offset, info: s.Info})
	}
	pd, err := rawPlannerData(m.PlannerRaw)
	if err != nil {
		return nil, err
	}
	if pd != nil {
		out.planner = map[string][]any{}
		known := map[string]bool{}
		for _, e := range out.entries {
			known[e.fqn] = true
		}
		for _, it := range pd.Items() {
			fqn, ok := it.Key.(string)
			if !ok {
				return nil, fmt.Errorf("%w: planner_data key %s is not a str", ErrUnsupported, pickle.Repr(it.Key))
			}
			var elems []any
			switch x := it.Value.(type) {
			case pickle.Tuple:
				elems = x
			case *pickle.List:
				elems = x.Items
			default:
				return nil, fmt.Errorf("%w: planner_data[%q] is %s, not a path tuple", ErrUnsupported, fqn, pickle.TypeName(it.Value))
			}
			path := make([]any, len(elems))
			for i, el := range elems {
				if s, ok := el.(string); ok {
					path[i] = s
				} else if n, ok := pickle.Int(el); ok {
					path[i] = n
				} else {
					return nil, fmt.Errorf("%w: planner_data[%q] element %d is %s", ErrUnsupported, fqn, i, pickle.TypeName(el))
				}
			}
			if _, dup := out.planner[fqn]; !dup && !known[fqn] {
				out.plannerExtra = append(out.plannerExtra, fqn)
			}
			out.planner[fqn] = path
		}
	}
	return out, nil
}

// rawPlannerData checks planner_data: nil for None or absent, an error for
// anything but the default planner's dict.
func rawPlannerData(v any) (*pickle.Dict, error) {
	if v == nil {
		return nil, nil
	}
	d, ok := v.(*pickle.Dict)
	if !ok {
		return nil, fmt.Errorf("%w: planner_data is %s, not the default planner's dict (a custom planner's data cannot be carried over)", ErrUnsupported, pickle.TypeName(v))
	}
	return d, nil
}

// clone returns a copy that can be appended to without touching m.
func (m *metadata) clone() *metadata {
	c := *m
	c.entries = append([]entry(nil), m.entries...)
	c.storage = append([]storageEntry(nil), m.storage...)
	if m.planner != nil {
		c.planner = make(map[string][]any, len(m.planner))
		for k, v := range m.planner {
			c.planner[k] = v
		}
	}
	return &c
}

// encode emits the protocol-2 .metadata pickle (FORMATS.md §2.6). When any
// entry has a planner path, planner_data covers every entry: entries without
// one get (fqn,), which is how a flat key unflattens anyway, because
// dcp_to_torch_save needs a path for every key.
func (m *metadata) encode() []byte {
	e := pickle.NewEncoder()
	e.Object(modMetadata, "Metadata", func() {
		n := 3
		if m.version != "" {
			n++
		}
		e.Dict(n, func() {
			e.Str("state_dict_metadata")
			e.Dict(len(m.entries), func() {
				for _, en := range m.entries {
					e.Str(en.fqn)
					if en.tensor == nil {
						e.Object(modMetadata, "BytesStorageMetadata", func() { e.Dict(0, nil) })
					} else {
						encodeTensor(e, en.tensor)
					}
				}
			})
			e.Str("planner_data")
			if m.planner == nil {
				e.None()
			} else {
				e.Dict(len(m.entries)+len(m.plannerExtra), func() {
					for _, en := range m.entries {
						e.Str(en.fqn)
						path, ok := m.planner[en.fqn]
						if !ok {
							path = []any{en.fqn}
						}
						encodePath(e, path)
					}
					for _, k := range m.plannerExtra {
						e.Str(k)
						encodePath(e, m.planner[k])
					}
				})
			}
			e.Str("storage_data")
			e.Dict(len(m.storage), func() {
				pos := m.chunkPositions()
				for _, s := range m.storage {
					encodeIndex(e, s, pos)
					encodeStorageInfo(e, s.info)
				}
			})
			if m.version != "" {
				e.Str("version")
				e.Str(m.version)
			}
		})
	})
	return e.Bytes()
}

// chunkPositions maps storageKey(fqn, offsets) → the chunk's position in its
// tensor, for MetadataIndex.index.
func (m *metadata) chunkPositions() map[string]int {
	pos := map[string]int{}
	for _, e := range m.entries {
		if e.tensor == nil {
			continue
		}
		for i, c := range e.tensor.chunks {
			k := storageKey(e.fqn, c.Offsets)
			if _, ok := pos[k]; !ok {
				pos[k] = i
			}
		}
	}
	return pos
}

func storageKey(fqn string, offset []int64) string {
	b := []byte(fqn)
	b = append(b, 0)
	if offset == nil {
		return string(append(b, '-'))
	}
	for _, o := range offset {
		b = strconv.AppendInt(b, o, 10)
		b = append(b, ',')
	}
	return string(b)
}

func encodePath(e *pickle.Encoder, path []any) {
	e.Tuple(len(path), func() {
		for _, el := range path {
			switch x := el.(type) {
			case string:
				e.Str(x)
			case int64:
				e.Int(x)
			}
		}
	})
}

// encodeSize emits torch.Size((v...)).
func encodeSize(e *pickle.Encoder, v []int64) {
	e.Call("torch", "Size", 1, func() { e.IntTuple(v) })
}

func encodeTensor(e *pickle.Encoder, t *tensorMeta) {
	e.Object(modMetadata, "TensorStorageMetadata", func() {
		e.Dict(3, func() {
			e.Str("properties")
			e.Object(modMetadata, "TensorProperties", func() {
				// The 5-tuple state every torch >= 2.3 accepts (a 6th element,
				// strides, breaks torch <= 2.14): 6 only to carry over an
				// entry that had strides.
				n := 5
				if t.strides != nil {
					n = 6
				}
				e.Tuple(n, func() {
					e.Global("torch", t.dtype)
					layout := t.layout
					if layout == "" {
						layout = "torch.strided"
					}
					e.Call("torch.serialization", "_get_layout", 1, func() { e.Str(layout) })
					e.Bool(t.requiresGrad)
					e.Call(modMetadata, "_MEM_FORMAT_ENCODING", 1, func() { e.Int(t.memoryFormat) })
					e.Bool(t.pinMemory)
					if t.strides != nil {
						e.IntTuple(t.strides)
					}
				})
			})
			e.Str("size")
			encodeSize(e, t.size)
			e.Str("chunks")
			e.List(len(t.chunks), func() {
				for _, c := range t.chunks {
					e.Object(modMetadata, "ChunkStorageMetadata", func() {
						e.Dict(2, func() {
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
func encodeIndex(e *pickle.Encoder, s storageEntry, pos map[string]int) {
	e.Object(modMetadata, "MetadataIndex", func() {
		n := 2
		if s.offset != nil {
			n = 3
		}
		e.Dict(n, func() {
			e.Str("fqn")
			e.Str(s.fqn)
			e.Str("index")
			if i, ok := pos[storageKey(s.fqn, s.offset)]; ok && s.offset != nil {
				e.Int(int64(i))
			} else {
				e.None()
			}
			if s.offset != nil {
				e.Str("offset")
				encodeSize(e, s.offset)
			}
		})
	})
}

func encodeStorageInfo(e *pickle.Encoder, info torchdcp.StorageInfo) {
	e.Object(modFilesystem, "_StorageInfo", func() {
		n := 3
		if info.TransformDescriptors != nil {
			n = 4
		}
		e.Dict(n, func() {
			e.Str("relative_path")
			e.Str(info.RelativePath)
			e.Str("offset")
			e.Int(info.Offset)
			e.Str("length")
			e.Int(info.Length)
			if info.TransformDescriptors != nil {
				e.Str("transform_descriptors")
				e.List(len(info.TransformDescriptors), func() {
					for _, d := range info.TransformDescriptors {
						e.Str(d)
					}
				})
			}
		})
	})
}
