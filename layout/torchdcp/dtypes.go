package torchdcp

import "github.com/ckptfs/ckptfs/layout/internal/torchzip"

// storageClasses maps the dtypes torch saves with typed storages to their
// class in module torch (torchzip.StorageClasses).
var storageClasses = torchzip.StorageClasses

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
