package torchdcp

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/pickle"
)

// Class paths of the .metadata pickle (FORMATS.md §2.2).
const (
	modMetadata   = "torch.distributed.checkpoint.metadata"
	modShardMeta  = "torch.distributed._shard.sharded_tensor.metadata"
	modFilesystem = "torch.distributed.checkpoint.filesystem"
	modMCore      = "megatron.core.dist_checkpointing.strategies.torch"
)

// Metadata is a decoded DCP .metadata file.
type Metadata struct {
	// Class is the root class: torch's Metadata, or Megatron's MCoreMetadata
	// (a Metadata subclass, decoded the same way).
	Class pickle.Global
	// Items is state_dict_metadata in file order.
	Items []Item
	// PlannerData maps a flat key to its original nesting (the default
	// planner's flatten mapping), integers formatted in decimal. Nil when the
	// checkpoint has none or a planner stored something else there.
	PlannerData map[string][]string
	// PlannerRaw is planner_data as decoded (nil when absent or None), with
	// int path elements kept as ints, for writers that carry it over.
	PlannerRaw any
	// Storage is storage_data in file order.
	Storage []StorageEntry
	// Version is Metadata.version ("" when absent).
	Version string
	// MCoreData is Megatron's mcore_data (fqn → dict), nil when absent.
	MCoreData *pickle.Dict

	storage map[string]int // storageKey → index in Storage
}

// Item is one state_dict_metadata entry: a tensor, or a BYTE_IO value when
// Tensor is nil.
type Item struct {
	FQN    string
	Tensor *TensorMetadata
}

// TensorMetadata is a TensorStorageMetadata.
type TensorMetadata struct {
	Properties TensorProperties
	// Size is the global shape.
	Size   []int64
	Chunks []ChunkMetadata
}

// TensorProperties is a TensorProperties (5-tuple state, or 6 with strides).
type TensorProperties struct {
	// DType is the torch dtype name without "torch." ("bfloat16").
	DType string
	// Layout is the layout name ("torch.strided").
	Layout       string
	RequiresGrad bool
	// MemoryFormat is the _MEM_FORMAT_ENCODING value (0 = contiguous).
	MemoryFormat int64
	PinMemory    bool
	// Strides is the 6th state element of newer torch, nil when absent or None.
	Strides []int64
}

// ChunkMetadata is a ChunkStorageMetadata: a box of the global tensor.
type ChunkMetadata struct {
	Offsets []int64
	Sizes   []int64
}

// Index is a MetadataIndex. Offset is nil for BYTE_IO items (no offset) and
// the chunk offsets for tensor chunks (empty, not nil, for 0-dim tensors).
type Index struct {
	FQN    string
	Offset []int64
}

// StorageInfo is a filesystem _StorageInfo: where an item's bytes live.
type StorageInfo struct {
	RelativePath string
	Offset       int64
	Length       int64
	// TransformDescriptors lists stream transforms, outermost first
	// (["stream.zstd/1"]); nil when none.
	TransformDescriptors []string
}

// StorageEntry is one storage_data entry.
type StorageEntry struct {
	Index Index
	Info  StorageInfo
}

// Lookup finds the storage of (fqn, offset) the way torch does: by fqn and
// offset only. offset nil means "no offset" (BYTE_IO).
func (m *Metadata) Lookup(fqn string, offset []int64) (StorageInfo, bool) {
	i, ok := m.storage[storageKey(fqn, offset)]
	if !ok {
		return StorageInfo{}, false
	}
	return m.Storage[i].Info, true
}

func storageKey(fqn string, offset []int64) string {
	var b strings.Builder
	b.WriteString(fqn)
	b.WriteByte(0)
	if offset == nil {
		b.WriteByte('-')
		return b.String()
	}
	for _, o := range offset {
		b.WriteString(strconv.FormatInt(o, 10))
		b.WriteByte(',')
	}
	return b.String()
}

// FieldError is a .metadata value of the wrong shape; Field names where it is
// (state_dict_metadata["w"].chunks[0].sizes).
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return "field " + e.Field + ": " + e.Msg }

// Unwrap makes errors.Is(err, ckpt.ErrInvalid) hold.
func (e *FieldError) Unwrap() error { return ckpt.ErrInvalid }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// DefaultMaxMetadataBytes bounds the .metadata file by default.
const DefaultMaxMetadataBytes = 1 << 30

// DecodeMetadata decodes a .metadata pickle with the restricted pickle VM and
// maps it onto Metadata. Unknown extra fields of the root are ignored
// (forward compatible); known fields of an unexpected type are errors naming
// the field.
func DecodeMetadata(r io.Reader) (*Metadata, error) {
	m, err := decodeMetadata(r, DefaultMaxMetadataBytes)
	if err != nil {
		return nil, fmt.Errorf("torchdcp: .metadata: %w", err)
	}
	return m, nil
}

// metadataItemsPerByte bounds how far a .metadata may expand: real ones
// expand to about 0.3 values per byte (nothing is shared but class names and
// short strings), so a file that expands to more is a memo bomb, and the
// bound keeps decoding time proportional to the file size.
const (
	metadataItemsPerByte = 1
	minMetadataItems     = 1 << 20
)

func decodeMetadata(r io.Reader, maxBytes int64) (*Metadata, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	opts := pickle.Options{MaxInputBytes: maxBytes,
		MaxItems: max(minMetadataItems, metadataItemsPerByte*int64(len(data)))}
	v, err := pickle.DecodeBytes(data, opts)
	if err != nil {
		var pe *pickle.Error
		if errors.As(err, &pe) {
			return nil, &invalidError{err: err}
		}
		return nil, err
	}
	return metadataFromValue(v)
}

// invalidError marks an error as ckpt.ErrInvalid without changing its text.
type invalidError struct{ err error }

func (e *invalidError) Error() string   { return e.err.Error() }
func (e *invalidError) Unwrap() []error { return []error{ckpt.ErrInvalid, e.err} }

func invalidf(format string, args ...any) error {
	return &invalidError{err: fmt.Errorf(format, args...)}
}

func metadataFromValue(v any) (*Metadata, error) {
	root, ok := v.(*pickle.Object)
	if !ok || !(root.Is(modMetadata, "Metadata") || root.Is(modMCore, "MCoreMetadata")) {
		return nil, fieldErr("(root)", "expected %s.Metadata, got %s", modMetadata, pickle.TypeName(v))
	}
	state := root.StateDict()
	if state == nil {
		return nil, fieldErr("(root)", "%s has no dict state", root.Class)
	}
	m := &Metadata{Class: root.Class, storage: map[string]int{}}

	sdm, ok := state.Get("state_dict_metadata")
	if !ok {
		return nil, fieldErr("state_dict_metadata", "missing")
	}
	if err := m.decodeStateDict(sdm); err != nil {
		return nil, err
	}
	if pd, ok := state.Get("planner_data"); ok {
		m.PlannerRaw = pd
		m.decodePlannerData(pd)
	}
	if sd, ok := state.Get("storage_data"); ok && sd != nil {
		if err := m.decodeStorageData(sd); err != nil {
			return nil, err
		}
	}
	if ver, ok := state.Get("version"); ok && ver != nil {
		switch x := ver.(type) {
		case string:
			m.Version = x
		case float64: // an early proposal stored 1.0
			m.Version = strconv.FormatFloat(x, 'f', -1, 64)
		default:
			return nil, fieldErr("version", "expected str, got %s", pickle.TypeName(ver))
		}
	}
	if mc, ok := state.Get("mcore_data"); ok && mc != nil {
		d, ok := mc.(*pickle.Dict)
		if !ok {
			return nil, fieldErr("mcore_data", "expected dict, got %s", pickle.TypeName(mc))
		}
		m.MCoreData = d
	}
	return m, nil
}

func (m *Metadata) decodeStateDict(v any) error {
	d, ok := v.(*pickle.Dict)
	if !ok {
		return fieldErr("state_dict_metadata", "expected dict, got %s", pickle.TypeName(v))
	}
	m.Items = make([]Item, 0, d.Len())
	for _, it := range d.Items() {
		fqn, ok := it.Key.(string)
		if !ok {
			return fieldErr("state_dict_metadata", "key %s is not a str", pickle.Repr(it.Key))
		}
		field := fmt.Sprintf("state_dict_metadata[%q]", fqn)
		obj, ok := it.Value.(*pickle.Object)
		switch {
		case ok && obj.Is(modMetadata, "BytesStorageMetadata"):
			m.Items = append(m.Items, Item{FQN: fqn})
		case ok && obj.Is(modMetadata, "TensorStorageMetadata"):
			t, err := decodeTensor(field, obj)
			if err != nil {
				return err
			}
			m.Items = append(m.Items, Item{FQN: fqn, Tensor: t})
		default:
			return fieldErr(field, "expected TensorStorageMetadata or BytesStorageMetadata, got %s", pickle.TypeName(it.Value))
		}
	}
	return nil
}

func stateOf(field string, obj *pickle.Object) (*pickle.Dict, error) {
	s := obj.StateDict()
	if s == nil {
		return nil, fieldErr(field, "%s has no dict state", obj.Class)
	}
	return s, nil
}

func getField(field string, d *pickle.Dict, key string) (any, string, error) {
	sub := field + "." + key
	v, ok := d.Get(key)
	if !ok {
		return nil, sub, fieldErr(sub, "missing")
	}
	return v, sub, nil
}

func decodeTensor(field string, obj *pickle.Object) (*TensorMetadata, error) {
	st, err := stateOf(field, obj)
	if err != nil {
		return nil, err
	}
	t := &TensorMetadata{}
	v, sub, err := getField(field, st, "properties")
	if err != nil {
		return nil, err
	}
	if t.Properties, err = decodeProperties(sub, v); err != nil {
		return nil, err
	}
	v, sub, err = getField(field, st, "size")
	if err != nil {
		return nil, err
	}
	if t.Size, err = decodeSize(sub, v); err != nil {
		return nil, err
	}
	v, sub, err = getField(field, st, "chunks")
	if err != nil {
		return nil, err
	}
	l, ok := v.(*pickle.List)
	if !ok {
		return nil, fieldErr(sub, "expected list, got %s", pickle.TypeName(v))
	}
	t.Chunks = make([]ChunkMetadata, 0, len(l.Items))
	for i, cv := range l.Items {
		cf := fmt.Sprintf("%s[%d]", sub, i)
		co, ok := cv.(*pickle.Object)
		if !ok || !co.Is(modMetadata, "ChunkStorageMetadata") {
			return nil, fieldErr(cf, "expected ChunkStorageMetadata, got %s", pickle.TypeName(cv))
		}
		cs, err := stateOf(cf, co)
		if err != nil {
			return nil, err
		}
		var c ChunkMetadata
		ov, of, err := getField(cf, cs, "offsets")
		if err != nil {
			return nil, err
		}
		if c.Offsets, err = decodeSize(of, ov); err != nil {
			return nil, err
		}
		sv, sf, err := getField(cf, cs, "sizes")
		if err != nil {
			return nil, err
		}
		if c.Sizes, err = decodeSize(sf, sv); err != nil {
			return nil, err
		}
		t.Chunks = append(t.Chunks, c)
	}
	return t, nil
}

func decodeProperties(field string, v any) (TensorProperties, error) {
	var p TensorProperties
	obj, ok := v.(*pickle.Object)
	if !ok || !(obj.Is(modMetadata, "TensorProperties") || obj.Is(modShardMeta, "TensorProperties")) {
		return p, fieldErr(field, "expected TensorProperties, got %s", pickle.TypeName(v))
	}
	st, ok := obj.State.(pickle.Tuple)
	if !ok || (len(st) != 5 && len(st) != 6) {
		return p, fieldErr(field, "expected a 5- or 6-tuple state, got %s", pickle.TypeName(obj.State))
	}
	dt, ok := st[0].(pickle.Global)
	if !ok || dt.Module != "torch" {
		return p, fieldErr(field+".dtype", "expected a torch dtype, got %s", pickle.TypeName(st[0]))
	}
	p.DType = dt.Name
	switch l := st[1].(type) {
	case pickle.Global: // torch.strided
		p.Layout = l.String()
	case *pickle.Object: // torch.serialization._get_layout("torch.strided")
		if len(l.Args) == 1 {
			if s, ok := l.Args[0].(string); ok && l.Is("torch.serialization", "_get_layout") {
				p.Layout = s
				break
			}
		}
		return p, fieldErr(field+".layout", "unexpected %s", pickle.Repr(l))
	default:
		return p, fieldErr(field+".layout", "expected a torch layout, got %s", pickle.TypeName(st[1]))
	}
	if p.RequiresGrad, ok = st[2].(bool); !ok {
		return p, fieldErr(field+".requires_grad", "expected bool, got %s", pickle.TypeName(st[2]))
	}
	mf, ok := st[3].(*pickle.Object)
	if !ok || len(mf.Args) != 1 || !(mf.Class.Name == "_MEM_FORMAT_ENCODING" || mf.Class.Name == "MEM_FORMAT_ENCODING") {
		return p, fieldErr(field+".memory_format", "expected a MEM_FORMAT_ENCODING member, got %s", pickle.TypeName(st[3]))
	}
	if p.MemoryFormat, ok = pickle.Int(mf.Args[0]); !ok {
		return p, fieldErr(field+".memory_format", "expected an int value, got %s", pickle.TypeName(mf.Args[0]))
	}
	if p.PinMemory, ok = st[4].(bool); !ok {
		return p, fieldErr(field+".pin_memory", "expected bool, got %s", pickle.TypeName(st[4]))
	}
	if len(st) == 6 && st[5] != nil {
		s, err := decodeInts(field+".strides", st[5])
		if err != nil {
			return p, err
		}
		p.Strides = s
	}
	return p, nil
}

// decodeSize accepts torch.Size((ints...)) and, leniently, a bare tuple or
// list of ints.
func decodeSize(field string, v any) ([]int64, error) {
	if obj, ok := v.(*pickle.Object); ok {
		if !obj.Is("torch", "Size") {
			return nil, fieldErr(field, "expected torch.Size, got %s", pickle.TypeName(v))
		}
		if len(obj.Args) != 1 {
			return nil, fieldErr(field, "torch.Size with %d arguments", len(obj.Args))
		}
		v = obj.Args[0]
	}
	return decodeInts(field, v)
}

func decodeInts(field string, v any) ([]int64, error) {
	var items []any
	switch x := v.(type) {
	case pickle.Tuple:
		items = x
	case *pickle.List:
		items = x.Items
	default:
		return nil, fieldErr(field, "expected a tuple of ints, got %s", pickle.TypeName(v))
	}
	out := make([]int64, len(items))
	for i, it := range items {
		n, ok := pickle.Int(it)
		if !ok {
			return nil, fieldErr(field, "element %d is %s, not an int that fits in 64 bits", i, pickle.TypeName(it))
		}
		out[i] = n
	}
	return out, nil
}

// decodePlannerData keeps the default planner's flatten mapping and ignores
// anything else: planner_data belongs to the planner, and a custom one may
// store whatever it likes there.
func (m *Metadata) decodePlannerData(v any) {
	d, ok := v.(*pickle.Dict)
	if !ok {
		return
	}
	out := make(map[string][]string, d.Len())
	for _, it := range d.Items() {
		fqn, ok := it.Key.(string)
		if !ok {
			continue
		}
		var elems []any
		switch x := it.Value.(type) {
		case pickle.Tuple:
			elems = x
		case *pickle.List:
			elems = x.Items
		default:
			continue
		}
		if path, ok := plannerPath(elems); ok {
			out[fqn] = path
		}
	}
	m.PlannerData = out
}

func plannerPath(elems []any) ([]string, bool) {
	path := make([]string, 0, len(elems))
	for _, e := range elems {
		if s, ok := e.(string); ok {
			path = append(path, s)
			continue
		}
		n, ok := pickle.Int(e)
		if !ok {
			return nil, false
		}
		path = append(path, strconv.FormatInt(n, 10))
	}
	return path, true
}

func (m *Metadata) decodeStorageData(v any) error {
	d, ok := v.(*pickle.Dict)
	if !ok {
		return fieldErr("storage_data", "expected dict, got %s", pickle.TypeName(v))
	}
	m.Storage = make([]StorageEntry, 0, d.Len())
	for i, it := range d.Items() {
		field := fmt.Sprintf("storage_data[%d]", i)
		idx, err := decodeIndex(field+".key", it.Key)
		if err != nil {
			return err
		}
		field = fmt.Sprintf("storage_data[%s]", idx)
		info, err := decodeStorageInfo(field, it.Value)
		if err != nil {
			return err
		}
		// Python compares MetadataIndex by (fqn, offset): a repeated key
		// replaces the earlier value.
		key := storageKey(idx.FQN, idx.Offset)
		if j, ok := m.storage[key]; ok {
			m.Storage[j].Info = info
			continue
		}
		m.storage[key] = len(m.Storage)
		m.Storage = append(m.Storage, StorageEntry{Index: idx, Info: info})
	}
	return nil
}

// String formats an index as in error messages: "w"(2,0) or "step".
func (i Index) String() string {
	if i.Offset == nil {
		return strconv.Quote(i.FQN)
	}
	return strconv.Quote(i.FQN) + formatOffsets(i.Offset)
}

// formatOffsets renders chunk offsets as a tuple: (2,0), or () for 0-dim.
func formatOffsets(o []int64) string {
	var b strings.Builder
	b.WriteByte('(')
	for i, v := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(v, 10))
	}
	b.WriteByte(')')
	return b.String()
}

func decodeIndex(field string, v any) (Index, error) {
	var idx Index
	obj, ok := v.(*pickle.Object)
	if !ok || !obj.Is(modMetadata, "MetadataIndex") {
		return idx, fieldErr(field, "expected MetadataIndex, got %s", pickle.TypeName(v))
	}
	st, err := stateOf(field, obj)
	if err != nil {
		return idx, err
	}
	fv, sub, err := getField(field, st, "fqn")
	if err != nil {
		return idx, err
	}
	if idx.FQN, ok = fv.(string); !ok {
		return idx, fieldErr(sub, "expected str, got %s", pickle.TypeName(fv))
	}
	if ov, ok := st.Get("offset"); ok && ov != nil {
		if idx.Offset, err = decodeSize(field+".offset", ov); err != nil {
			return idx, err
		}
	}
	return idx, nil
}

func decodeStorageInfo(field string, v any) (StorageInfo, error) {
	var info StorageInfo
	obj, ok := v.(*pickle.Object)
	if !ok || !obj.Is(modFilesystem, "_StorageInfo") {
		return info, fieldErr(field, "expected _StorageInfo, got %s", pickle.TypeName(v))
	}
	st, err := stateOf(field, obj)
	if err != nil {
		return info, err
	}
	rv, sub, err := getField(field, st, "relative_path")
	if err != nil {
		return info, err
	}
	if info.RelativePath, ok = rv.(string); !ok {
		return info, fieldErr(sub, "expected str, got %s", pickle.TypeName(rv))
	}
	for _, f := range []struct {
		key string
		dst *int64
	}{{"offset", &info.Offset}, {"length", &info.Length}} {
		iv, sub, err := getField(field, st, f.key)
		if err != nil {
			return info, err
		}
		n, ok := pickle.Int(iv)
		if !ok {
			return info, fieldErr(sub, "expected an int that fits in 64 bits, got %s", pickle.TypeName(iv))
		}
		*f.dst = n
	}
	if tv, ok := st.Get("transform_descriptors"); ok && tv != nil {
		var items []any
		switch x := tv.(type) {
		case pickle.Tuple:
			items = x
		case *pickle.List:
			items = x.Items
		default:
			return info, fieldErr(field+".transform_descriptors", "expected a list of str, got %s", pickle.TypeName(tv))
		}
		for i, it := range items {
			s, ok := it.(string)
			if !ok {
				return info, fieldErr(field+".transform_descriptors", "element %d is %s, not str", i, pickle.TypeName(it))
			}
			info.TransformDescriptors = append(info.TransformDescriptors, s)
		}
	}
	return info, nil
}
