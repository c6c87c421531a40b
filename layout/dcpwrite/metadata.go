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
	p := newPickler()
	p.object(modMetadata, "Metadata", func() {
		n := 3
		if m.version != "" {
			n++
		}
		p.dict(n, func() {
			p.str("state_dict_metadata")
			p.dict(len(m.entries), func() {
				for _, e := range m.entries {
					p.str(e.fqn)
					if e.tensor == nil {
						p.object(modMetadata, "BytesStorageMetadata", func() { p.op(opEmptyDict) })
					} else {
						encodeTensor(p, e.tensor)
					}
				}
			})
			p.str("planner_data")
			if m.planner == nil {
				p.op(opNone)
			} else {
				p.dict(len(m.entries)+len(m.plannerExtra), func() {
					for _, e := range m.entries {
						p.str(e.fqn)
						path, ok := m.planner[e.fqn]
						if !ok {
							path = []any{e.fqn}
						}
						encodePath(p, path)
					}
					for _, k := range m.plannerExtra {
						p.str(k)
						encodePath(p, m.planner[k])
					}
				})
			}
			p.str("storage_data")
			p.dict(len(m.storage), func() {
				pos := m.chunkPositions()
				for _, s := range m.storage {
					encodeIndex(p, s, pos)
					encodeStorageInfo(p, s.info)
				}
			})
			if m.version != "" {
				p.str("version")
				p.str(m.version)
			}
		})
	})
	return p.finish()
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

func encodePath(p *pickler, path []any) {
	p.tuple(len(path), func() {
		for _, el := range path {
			switch x := el.(type) {
			case string:
				p.str(x)
			case int64:
				p.int(x)
			}
		}
	})
}

func encodeTensor(p *pickler, t *tensorMeta) {
	p.object(modMetadata, "TensorStorageMetadata", func() {
		p.dict(3, func() {
			p.str("properties")
			p.object(modMetadata, "TensorProperties", func() {
				// The 5-tuple state every torch >= 2.3 accepts (a 6th element,
				// strides, breaks torch <= 2.14): 6 only to carry over an
				// entry that had strides.
				n := 5
				if t.strides != nil {
					n = 6
				}
				p.tuple(n, func() {
					p.global("torch", t.dtype)
					p.global("torch.serialization", "_get_layout")
					layout := t.layout
					if layout == "" {
						layout = "torch.strided"
					}
					p.str(layout)
					p.op(opTuple1, opReduce)
					p.bool(t.requiresGrad)
					p.global(modMetadata, "_MEM_FORMAT_ENCODING")
					p.int(t.memoryFormat)
					p.op(opTuple1, opReduce)
					p.bool(t.pinMemory)
					if t.strides != nil {
						p.intTuple(t.strides)
					}
				})
			})
			p.str("size")
			p.size(t.size)
			p.str("chunks")
			p.list(len(t.chunks), func() {
				for _, c := range t.chunks {
					p.object(modMetadata, "ChunkStorageMetadata", func() {
						p.dict(2, func() {
							p.str("offsets")
							p.size(c.Offsets)
							p.str("sizes")
							p.size(c.Sizes)
						})
					})
				}
			})
		})
	})
}

// encodeIndex emits MetadataIndex with the state torch pickles: fqn, index,
// then offset only for tensor chunks.
func encodeIndex(p *pickler, s storageEntry, pos map[string]int) {
	p.object(modMetadata, "MetadataIndex", func() {
		n := 2
		if s.offset != nil {
			n = 3
		}
		p.dict(n, func() {
			p.str("fqn")
			p.str(s.fqn)
			p.str("index")
			if i, ok := pos[storageKey(s.fqn, s.offset)]; ok && s.offset != nil {
				p.int(int64(i))
			} else {
				p.op(opNone)
			}
			if s.offset != nil {
				p.str("offset")
				p.size(s.offset)
			}
		})
	})
}

func encodeStorageInfo(p *pickler, info torchdcp.StorageInfo) {
	p.object(modFilesystem, "_StorageInfo", func() {
		n := 3
		if info.TransformDescriptors != nil {
			n = 4
		}
		p.dict(n, func() {
			p.str("relative_path")
			p.str(info.RelativePath)
			p.str("offset")
			p.int(info.Offset)
			p.str("length")
			p.int(info.Length)
			if info.TransformDescriptors != nil {
				p.str("transform_descriptors")
				p.list(len(info.TransformDescriptors), func() {
					for _, d := range info.TransformDescriptors {
						p.str(d)
					}
				})
			}
		})
	})
}
