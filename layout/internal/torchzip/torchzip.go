// Package torchzip is what torch.save zip archives have in common wherever
// they appear (a DCP chunk record, an HF pytorch_model.bin, a Megatron
// model_optim_rng.pt or common.pt): Open, the way into an archive for
// every reader, with the same hostile checks for all (OpenRecord: the same
// checks on a DCP chunk record's windows, without archive/zip's
// allocations, for a reader that opens one per chunk); data.pkl decoded by
// the restricted pickle VM (nothing is executed) within one of the named
// Limits sets; the storage persistent ids and tensor rebuild calls, the
// storage dtypes, the contiguity rule, and bounded reads of small entries;
// Windowed, an archive's head and tail read in one read each, for a reader
// that opens many small archives (a DCP chunk record per chunk).
// The formats own where archives sit and what they must hold.
package torchzip

import (
	"archive/zip"
	"fmt"
	"io"

	"github.com/ckptfs/ckptfs/layout/pickle"
	"github.com/ckptfs/ckptfs/safetensors"
)

// Storage is what the persistent-load hook returns for
// ('storage', storage_type, key, location, numel).
type Storage struct {
	Type  pickle.Global
	Key   string
	Numel int64 // elements of a typed storage, bytes of an UntypedStorage
}

// PersistentLoad resolves a data.pkl persistent id to a *Storage; it is the
// pickle.Options.PersistentLoad of every torch.save archive.
func PersistentLoad(pid any) (any, error) {
	t, ok := pid.(pickle.Tuple)
	if !ok || len(t) != 5 {
		return nil, fmt.Errorf("persistent id %s is not a 5-tuple", pickle.Repr(pid))
	}
	if s, _ := t[0].(string); s != "storage" {
		return nil, fmt.Errorf("persistent id of kind %s, want 'storage'", pickle.Repr(t[0]))
	}
	typ, ok := t[1].(pickle.Global)
	if !ok {
		return nil, fmt.Errorf("storage type %s is not a class", pickle.Repr(t[1]))
	}
	key, ok := t[2].(string)
	if !ok {
		return nil, fmt.Errorf("storage key %s is not a str", pickle.Repr(t[2]))
	}
	numel, ok := pickle.Int(t[4])
	if !ok || numel < 0 {
		return nil, fmt.Errorf("storage size %s is not a non-negative int", pickle.Repr(t[4]))
	}
	return &Storage{Type: typ, Key: key, Numel: numel}, nil
}

// Rebuild is a tensor rebuild: _rebuild_tensor_v2/v3 and its arguments.
type Rebuild struct {
	Storage       *Storage
	StorageOffset int64 // elements
	Size, Stride  []int64
	DType         string // v3 only
}

// ParseRebuild interprets v, a decoded data.pkl value, as a tensor rebuild,
// unwrapping nn.Parameter and tensor subclasses. what names v in errors
// ("data.pkl").
func ParseRebuild(v any, what string) (*Rebuild, error) {
	obj, ok := v.(*pickle.Object)
	// Unwrap nn.Parameter and tensor subclasses down to the tensor rebuild.
	for i := 0; ok && i < 4; i++ {
		switch {
		case obj.Is("torch._utils", "_rebuild_parameter"), obj.Is("torch._utils", "_rebuild_parameter_with_state"):
			if len(obj.Args) == 0 {
				return nil, fmt.Errorf("%s: %s without arguments", what, obj.Class)
			}
			obj, ok = obj.Args[0].(*pickle.Object)
			continue
		case obj.Is("torch._tensor", "_rebuild_from_type_v2"):
			if len(obj.Args) < 3 {
				return nil, fmt.Errorf("%s: %s with %d arguments", what, obj.Class, len(obj.Args))
			}
			fn, ok1 := obj.Args[0].(pickle.Global)
			args, ok2 := obj.Args[2].(pickle.Tuple)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("%s: unexpected %s arguments", what, obj.Class)
			}
			obj = &pickle.Object{Class: fn, Args: args}
			continue
		}
		break
	}
	if !ok {
		return nil, fmt.Errorf("%s holds %s, not a tensor", what, pickle.TypeName(v))
	}
	v3 := obj.Is("torch._utils", "_rebuild_tensor_v3")
	if !v3 && !obj.Is("torch._utils", "_rebuild_tensor_v2") {
		return nil, fmt.Errorf("%s rebuilds with %s, not _rebuild_tensor_v2/v3", what, obj.Class)
	}
	want := 6
	if v3 {
		want = 7
	}
	if len(obj.Args) < want {
		return nil, fmt.Errorf("%s: %s with %d arguments, want at least %d", what, obj.Class.Name, len(obj.Args), want)
	}
	c := &Rebuild{}
	if c.Storage, ok = obj.Args[0].(*Storage); !ok {
		return nil, fmt.Errorf("%s: storage argument is %s, not a persistent storage", what, pickle.TypeName(obj.Args[0]))
	}
	if c.StorageOffset, ok = pickle.Int(obj.Args[1]); !ok || c.StorageOffset < 0 {
		return nil, fmt.Errorf("%s: storage offset %s is not a non-negative int", what, pickle.Repr(obj.Args[1]))
	}
	var err error
	if c.Size, err = ints("size", obj.Args[2]); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if c.Stride, err = ints("stride", obj.Args[3]); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(c.Size) != len(c.Stride) {
		return nil, fmt.Errorf("%s: size %v and stride %v differ in rank", what, c.Size, c.Stride)
	}
	if v3 {
		g, ok := obj.Args[6].(pickle.Global)
		if !ok || g.Module != "torch" {
			return nil, fmt.Errorf("%s: dtype argument is %s, not a torch dtype", what, pickle.TypeName(obj.Args[6]))
		}
		c.DType = g.Name
	}
	return c, nil
}

// maxRank bounds a tensor's number of dimensions (torch allows 64).
const maxRank = 64

// ints decodes a size or stride: a tuple (or torch.Size) of non-negative
// ints.
func ints(field string, v any) ([]int64, error) {
	out, err := Ints(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	if len(out) > maxRank {
		return nil, fmt.Errorf("%s: %d dimensions, more than %d", field, len(out), maxRank)
	}
	for i, n := range out {
		if n < 0 {
			return nil, fmt.Errorf("%s: element %d is %d, not a non-negative int", field, i, n)
		}
	}
	return out, nil
}

// Ints decodes what torch pickles for a shape, a stride or an offset: a
// torch.Size, a tuple or a list of ints that fit in 64 bits.
func Ints(v any) ([]int64, error) {
	if obj, ok := v.(*pickle.Object); ok && obj.Is("torch", "Size") && len(obj.Args) == 1 {
		v = obj.Args[0]
	}
	items, ok := pickle.Seq(v)
	if !ok {
		return nil, fmt.Errorf("expected a tuple of ints, got %s", pickle.TypeName(v))
	}
	out := make([]int64, len(items))
	for i, it := range items {
		n, ok := pickle.Int(it)
		if !ok {
			return nil, fmt.Errorf("element %d is %s, not an int that fits in 64 bits", i, pickle.TypeName(it))
		}
		out[i] = n
	}
	return out, nil
}

// StorageDType is the dtype of the tensor r rebuilds, from its typed
// storage class or the v3 argument; typed says whether the storage counts
// elements (a typed storage) rather than bytes (UntypedStorage).
func (r *Rebuild) StorageDType() (dtype string, typed bool, err error) {
	st := r.Storage
	switch {
	case st.Type.Module == "torch" && TypedStorages[st.Type.Name] != "":
		dtype = TypedStorages[st.Type.Name]
		if r.DType != "" && r.DType != dtype {
			return "", false, fmt.Errorf("%s holds %s but the tensor is %s", st.Type, dtype, r.DType)
		}
		return dtype, true, nil
	case st.Type.Name == "UntypedStorage" && (st.Type.Module == "torch.storage" || st.Type.Module == "torch"):
		if r.DType == "" {
			return "", false, fmt.Errorf("UntypedStorage without a dtype (needs _rebuild_tensor_v3)")
		}
		return r.DType, false, nil
	default:
		return "", false, fmt.Errorf("unsupported storage type %s", st.Type)
	}
}

// StorageClasses maps the dtypes torch still saves with typed storages
// (torch/storage.py _dtype_to_storage_type_map) to their class in module
// torch. A record of one of them rebuilds with _rebuild_tensor_v2.
var StorageClasses = map[string]string{
	"float64":    "DoubleStorage",
	"float32":    "FloatStorage",
	"float16":    "HalfStorage",
	"bfloat16":   "BFloat16Storage",
	"int64":      "LongStorage",
	"int32":      "IntStorage",
	"int16":      "ShortStorage",
	"int8":       "CharStorage",
	"uint8":      "ByteStorage",
	"bool":       "BoolStorage",
	"complex64":  "ComplexFloatStorage",
	"complex128": "ComplexDoubleStorage",
}

// TypedStorages is StorageClasses inverted: class name → dtype.
var TypedStorages = func() map[string]string {
	m := make(map[string]string, len(StorageClasses))
	for dtype, class := range StorageClasses {
		m[class] = dtype
	}
	return m
}()

// TorchOnlyDTypes are the dtypes torch 2.15 has and safetensors does not:
// tensors of these are left out of views with a reason. Any other name that
// safetensors does not know is not a torch dtype at all.
var TorchOnlyDTypes = map[string]bool{
	"bcomplex32": true, "complex32": true, "complex128": true,
	"bits16": true, "bits1x8": true, "bits2x4": true, "bits4x2": true, "bits8": true,
	"qint32": true, "qint8": true, "quint2x4": true, "quint4x2": true, "quint8": true,
	"int1": true, "int2": true, "int3": true, "int4": true, "int5": true, "int6": true, "int7": true,
	"uint1": true, "uint2": true, "uint3": true, "uint4": true, "uint5": true, "uint6": true, "uint7": true,
	"float4_e2m1fn_x2": true,
}

// DType maps a torch dtype name to safetensors and its element size.
func DType(torch string) (safetensors.DType, int64, bool) {
	d, ok := safetensors.FromTorch(torch)
	if !ok || d.Size() <= 0 {
		return "", 0, false
	}
	return d, int64(d.Size()), true
}

// Contiguous reports whether stride is C-contiguous for size, with torch's
// rules: dimensions of size 1 may have any stride, and a tensor with no
// elements is always contiguous.
func Contiguous(size, stride []int64) bool {
	if len(size) != len(stride) {
		return false
	}
	for _, s := range size {
		if s == 0 {
			return true
		}
	}
	expected := int64(1)
	for d := len(size) - 1; d >= 0; d-- {
		if size[d] == 1 {
			continue
		}
		if stride[d] != expected {
			return false
		}
		expected *= size[d]
	}
	return true
}

// ReadEntry reads a small entry whole, refusing one larger than limit.
func ReadEntry(f *zip.File, limit int64) ([]byte, error) {
	if f.UncompressedSize64 > uint64(limit) {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d allowed", f.Name, f.UncompressedSize64, limit)
	}
	rc, err := f.Open()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Name, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is more than the %d bytes allowed", f.Name, limit)
	}
	return b, nil
}
