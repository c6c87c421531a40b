package torchdcp

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/torchzip"
	"github.com/ckptfs/ckptfs/layout/pickle"
)

// Decoding .metadata: the restricted pickle VM builds inert values, mapped
// here onto Metadata, field by field, every field checked.

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
	return decodeMetadataBytes(data, maxBytes)
}

func decodeMetadataBytes(data []byte, maxBytes int64) (*Metadata, error) {
	return decodeMetadataWith(data, maxBytes, nil)
}

// decodeMetadataWith decodes data, through the stream s when it is not nil
// (metadatastream.go).
func decodeMetadataWith(data []byte, maxBytes int64, s *stream) (*Metadata, error) {
	opts := pickle.Options{MaxInputBytes: maxBytes,
		MaxItems: max(minMetadataItems, metadataItemsPerByte*int64(len(data)))}
	if s != nil {
		opts.Sink, opts.Release = s, s.release
	}
	v, err := pickle.DecodeBytes(data, opts)
	if err != nil {
		var pe *pickle.Error
		if errors.As(err, &pe) {
			return nil, &invalidError{err: err}
		}
		return nil, err
	}
	return metadataFromValue(v, s)
}

// invalidError marks an error as ckpt.ErrInvalid without changing its text.
type invalidError struct{ err error }

func (e *invalidError) Error() string   { return e.err.Error() }
func (e *invalidError) Unwrap() []error { return []error{ckpt.ErrInvalid, e.err} }

func invalidf(format string, args ...any) error {
	return &invalidError{err: fmt.Errorf(format, args...)}
}

// metadataFromValue maps the decoded root onto Metadata; s is the stream
// that took the chunks and storage entries out of it, or nil.
func metadataFromValue(v any, s *stream) (*Metadata, error) {
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
	if err := m.decodeStateDict(sdm, s); err != nil {
		return nil, err
	}
	if pd, ok := state.Get("planner_data"); ok {
		m.decodePlannerData(pd)
	}
	sd, ok := state.Get("storage_data")
	if s != nil && s.storageDict != nil && (!ok || s.storageDict != sd) {
		return nil, errStream // storage entries outside storage_data
	}
	if ok && sd != nil {
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

func (m *Metadata) decodeStateDict(v any, s *stream) error {
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
		tr, isRef := it.Value.(tensorRef)
		switch {
		case isRef && s != nil:
			m.Items = append(m.Items, Item{FQN: fqn, Tensor: tr.t.t})
		case ok && obj.Is(modMetadata, "BytesStorageMetadata"):
			m.Items = append(m.Items, Item{FQN: fqn})
		case ok && obj.Is(modMetadata, "TensorStorageMetadata"):
			t, err := decodeTensor(field, obj, decodeChunkAt, true)
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

// within names the field of a FieldError err relative to prefix. The
// decoders of the parts a .metadata has one of per chunk name their fields
// relative to the part, and their callers add the part's name only on
// error: formatting names up front was a measurable part of opening a
// checkpoint of many chunks (BENCHMARKS.md, opening).
func within(prefix string, err error) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		return &FieldError{Field: prefix + fe.Field, Msg: fe.Msg}
	}
	return err
}

// sizeField decodes the torch.Size in field key of d; name is ".key", for
// errors. key is an any so that callers box a constant, which allocates
// nothing (a string parameter is boxed again on every call).
func sizeField(d *pickle.Dict, key any, name string) ([]int64, error) {
	v, ok := d.Get(key)
	if !ok {
		return nil, fieldErr(name, "missing")
	}
	return decodeSize(name, v)
}

// classState returns the dict state of v, which must be an object of
// module.class (errors name the object itself: see within).
func classState(v any, module, class string) (*pickle.Dict, error) {
	obj, ok := v.(*pickle.Object)
	if !ok || !obj.Is(module, class) {
		return nil, fieldErr("", "expected %s, got %s", class, pickle.TypeName(v))
	}
	return stateOf("", obj)
}

// decodeChunk decodes one ChunkStorageMetadata (fields named relative to
// it: see within).
func decodeChunk(v any) (ChunkMetadata, error) {
	var c ChunkMetadata
	cs, err := classState(v, modMetadata, "ChunkStorageMetadata")
	if err != nil {
		return c, err
	}
	if c.Offsets, err = sizeField(cs, "offsets", ".offsets"); err != nil {
		return c, err
	}
	if c.Sizes, err = sizeField(cs, "sizes", ".sizes"); err != nil {
		return c, err
	}
	return c, nil
}

// decodeChunkAt decodes chunk i of a tensor's chunks list: decodeChunk.
func decodeChunkAt(_ int, v any) (ChunkMetadata, error) { return decodeChunk(v) }

// decodeTensor decodes a TensorStorageMetadata, its chunks with chunk
// (into Chunks, unless keep is false: the caller keeps them).
func decodeTensor(field string, obj *pickle.Object, chunk func(i int, v any) (ChunkMetadata, error), keep bool) (*TensorMetadata, error) {
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
	if keep {
		t.Chunks = make([]ChunkMetadata, 0, len(l.Items))
	}
	for i, cv := range l.Items {
		c, err := chunk(i, cv)
		if err != nil {
			return nil, within(fmt.Sprintf("%s[%d]", sub, i), err)
		}
		if keep {
			t.Chunks = append(t.Chunks, c)
		}
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
	out, err := torchzip.Ints(v)
	if err != nil {
		return nil, fieldErr(field, "%v", err)
	}
	return out, nil
}

// decodePlannerData reads planner_data. It belongs to the planner, and a
// custom one may store whatever it likes there: what is not the default
// planner's flatten mapping (str key → tuple of str and int) is left out
// and noted in PlannerErr, never an error.
func (m *Metadata) decodePlannerData(v any) {
	if v == nil {
		return
	}
	d, ok := v.(*pickle.Dict)
	if !ok {
		m.PlannerErr = fmt.Errorf("planner_data is %s, not the default planner's dict", pickle.TypeName(v))
		return
	}
	m.Planner = make([]PlannerEntry, 0, d.Len())
	m.PlannerData = make(map[string][]string, d.Len())
	for _, it := range d.Items() {
		fqn, ok := it.Key.(string)
		if !ok {
			m.PlannerErr = cmp.Or(m.PlannerErr, fmt.Errorf("planner_data key %s is not a str", pickle.Repr(it.Key)))
			continue
		}
		path, err := plannerPath(fqn, it.Value)
		if err != nil {
			m.PlannerErr = cmp.Or(m.PlannerErr, err)
			continue
		}
		m.Planner = append(m.Planner, PlannerEntry{Key: fqn, Path: path})
		m.PlannerData[fqn] = pathStrings(path)
	}
}

// plannerPath reads the path of planner_data[fqn]: a tuple (or list) of
// str and int.
func plannerPath(fqn string, v any) ([]any, error) {
	elems, ok := pickle.Seq(v)
	if !ok {
		return nil, fmt.Errorf("planner_data[%q] is %s, not a path tuple", fqn, pickle.TypeName(v))
	}
	path := make([]any, len(elems))
	for i, e := range elems {
		if s, ok := e.(string); ok {
			path[i] = s
		} else if n, ok := pickle.Int(e); ok {
			path[i] = n
		} else {
			return nil, fmt.Errorf("planner_data[%q] element %d is %s", fqn, i, pickle.TypeName(e))
		}
	}
	return path, nil
}

func (m *Metadata) decodeStorageData(v any) error {
	d, ok := v.(*pickle.Dict)
	if !ok {
		return fieldErr("storage_data", "expected dict, got %s", pickle.TypeName(v))
	}
	m.Storage = make([]StorageEntry, 0, d.Len())
	m.storage = make(map[string]int, d.Len())
	for i, it := range d.Items() {
		idx, err := decodeIndex(it.Key)
		if err != nil {
			return within(fmt.Sprintf("storage_data[%d].key", i), err)
		}
		info, err := decodeStorageInfo(it.Value)
		if err != nil {
			return within(fmt.Sprintf("storage_data[%s]", idx), err)
		}
		// Python compares MetadataIndex by (fqn, offset): a repeated key
		// replaces the earlier value.
		m.addStorage(StorageEntry{Index: idx, Info: info})
	}
	return nil
}

// decodeIndex decodes a MetadataIndex (fields named relative to it: see
// within).
func decodeIndex(v any) (Index, error) {
	var idx Index
	st, err := classState(v, modMetadata, "MetadataIndex")
	if err != nil {
		return idx, err
	}
	if idx.FQN, err = strField(st, "fqn", ".fqn"); err != nil {
		return idx, err
	}
	if ov, ok := st.Get("offset"); ok && ov != nil {
		if idx.Offset, err = decodeSize(".offset", ov); err != nil {
			return idx, err
		}
	}
	return idx, nil
}

// intField decodes the int in field key of d; name is ".key", for errors
// (key is an any as in sizeField).
func intField(d *pickle.Dict, key any, name string) (int64, error) {
	v, ok := d.Get(key)
	if !ok {
		return 0, fieldErr(name, "missing")
	}
	n, ok := pickle.Int(v)
	if !ok {
		return 0, fieldErr(name, "expected an int that fits in 64 bits, got %s", pickle.TypeName(v))
	}
	return n, nil
}

// strField decodes the str in field key of d, as intField.
func strField(d *pickle.Dict, key any, name string) (string, error) {
	v, ok := d.Get(key)
	if !ok {
		return "", fieldErr(name, "missing")
	}
	s, ok := v.(string)
	if !ok {
		return "", fieldErr(name, "expected str, got %s", pickle.TypeName(v))
	}
	return s, nil
}

// decodeStorageInfo decodes a _StorageInfo (fields named relative to it:
// see within).
func decodeStorageInfo(v any) (StorageInfo, error) {
	var info StorageInfo
	obj, ok := v.(*pickle.Object)
	if !ok || !isStorageInfo(obj) {
		return info, fieldErr("", "expected _StorageInfo, got %s", pickle.TypeName(v))
	}
	st, err := stateOf("", obj)
	if err != nil {
		return info, err
	}
	if info.RelativePath, err = strField(st, "relative_path", ".relative_path"); err != nil {
		return info, err
	}
	if info.Offset, err = intField(st, "offset", ".offset"); err != nil {
		return info, err
	}
	if info.Length, err = intField(st, "length", ".length"); err != nil {
		return info, err
	}
	if tv, ok := st.Get("transform_descriptors"); ok && tv != nil {
		items, ok := pickle.Seq(tv)
		if !ok {
			return info, fieldErr(".transform_descriptors", "expected a list of str, got %s", pickle.TypeName(tv))
		}
		for i, it := range items {
			s, ok := it.(string)
			if !ok {
				return info, fieldErr(".transform_descriptors", "element %d is %s, not str", i, pickle.TypeName(it))
			}
			info.TransformDescriptors = append(info.TransformDescriptors, s)
		}
	}
	return info, nil
}
