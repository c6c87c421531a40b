package safetensors

// DType is a safetensors dtype string as it appears in a header ("F32", "BF16", ...).
type DType string

const (
	BOOL        DType = "BOOL"
	U8          DType = "U8"
	I8          DType = "I8"
	I16         DType = "I16"
	U16         DType = "U16"
	F16         DType = "F16"
	BF16        DType = "BF16"
	I32         DType = "I32"
	U32         DType = "U32"
	F32         DType = "F32"
	C64         DType = "C64"
	F64         DType = "F64"
	I64         DType = "I64"
	U64         DType = "U64"
	F8_E5M2     DType = "F8_E5M2"
	F8_E4M3     DType = "F8_E4M3"
	F8_E8M0     DType = "F8_E8M0"
	F8_E4M3FNUZ DType = "F8_E4M3FNUZ"
	F8_E5M2FNUZ DType = "F8_E5M2FNUZ"
	F4          DType = "F4"
	F6_E2M3     DType = "F6_E2M3"
	F6_E3M2     DType = "F6_E3M2"
)

type dtypeInfo struct {
	bits  int
	torch string // torch dtype name (torch.<name>); "" when torch has none
}

var dtypes = map[DType]dtypeInfo{
	BOOL:        {8, "bool"},
	U8:          {8, "uint8"},
	I8:          {8, "int8"},
	I16:         {16, "int16"},
	U16:         {16, "uint16"},
	F16:         {16, "float16"},
	BF16:        {16, "bfloat16"},
	I32:         {32, "int32"},
	U32:         {32, "uint32"},
	F32:         {32, "float32"},
	C64:         {64, "complex64"},
	F64:         {64, "float64"},
	I64:         {64, "int64"},
	U64:         {64, "uint64"},
	F8_E5M2:     {8, "float8_e5m2"},
	F8_E4M3:     {8, "float8_e4m3fn"},
	F8_E8M0:     {8, "float8_e8m0fnu"},
	F8_E4M3FNUZ: {8, "float8_e4m3fnuz"},
	F8_E5M2FNUZ: {8, "float8_e5m2fnuz"},
	F4:          {4, ""},
	F6_E2M3:     {6, ""},
	F6_E3M2:     {6, ""},
}

var fromTorch = func() map[string]DType {
	m := map[string]DType{}
	for d, info := range dtypes {
		if info.torch != "" {
			m[info.torch] = d
		}
	}
	return m
}()

// Bits is the width of one element in bits, or 0 for an unknown dtype.
func (d DType) Bits() int { return dtypes[d].bits }

// Size is the width of one element in bytes, or 0 for an unknown or
// sub-byte dtype.
func (d DType) Size() int {
	b := dtypes[d].bits
	if b%8 != 0 {
		return 0
	}
	return b / 8
}

// Known reports whether d is a dtype this package understands.
func (d DType) Known() bool { _, ok := dtypes[d]; return ok }

// Torch returns the torch dtype name (without the "torch." prefix), or "".
func (d DType) Torch() string { return dtypes[d].torch }

// FromTorch maps a torch dtype name ("float32", "bfloat16", ...) to its
// safetensors dtype.
func FromTorch(name string) (DType, bool) {
	d, ok := fromTorch[name]
	return d, ok
}
