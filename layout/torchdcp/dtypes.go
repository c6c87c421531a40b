package torchdcp

// storageClasses maps the dtypes torch still saves with typed storages
// (torch/storage.py _dtype_to_storage_type_map) to their class in module
// torch. A record of one of them rebuilds with _rebuild_tensor_v2.
var storageClasses = map[string]string{
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

// typedStorages is storageClasses inverted: class name → dtype.
var typedStorages = func() map[string]string {
	m := make(map[string]string, len(storageClasses))
	for dtype, class := range storageClasses {
		m[class] = dtype
	}
	return m
}()

// untypedDTypes are the torch/storage.py _new_dtypes() that safetensors can
// carry: saved as a torch.storage.UntypedStorage of bytes, rebuilt with
// _rebuild_tensor_v3 and a trailing dtype.
var untypedDTypes = map[string]bool{
	"float8_e5m2":     true,
	"float8_e4m3fn":   true,
	"float8_e5m2fnuz": true,
	"float8_e4m3fnuz": true,
	"float8_e8m0fnu":  true,
	"uint16":          true,
	"uint32":          true,
	"uint64":          true,
}

// Storable reports whether a record can hold a tensor of the torch dtype
// (a name without "torch.", as safetensors.DType.Torch gives it).
func Storable(dtype string) bool {
	_, typed := storageClasses[dtype]
	return typed || untypedDTypes[dtype]
}
