// Package convert changes the floating-point type of little-endian tensor
// bytes the way torch's Tensor.to does on CPU, bit for bit (checked against
// torch 2.15 with testdata/gen.py): round to nearest even, infinities kept,
// other types through float32 as torch's casts go. NaN is written as torch
// writes it, which depends on the kernel: float32 → bf16 (vectorised) gives
// 0xFFFF, other sources → bf16 (scalar) 0x7FC0; → fp16 keeps the sign and
// the top payload bits with the quiet bit set; fp16 → float32 quiets it.
package convert

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/ckptfs/ckptfs/safetensors"
)

// Floating reports whether d is a type Convert reads or writes.
func Floating(d safetensors.DType) bool {
	switch d {
	case safetensors.F32, safetensors.F16, safetensors.BF16, safetensors.F64:
		return true
	}
	return false
}

// Convert writes the n = len(src)/size(from) elements of src, converted to
// the type to, into dst (which must hold n elements of to).
func Convert(dst []byte, to safetensors.DType, src []byte, from safetensors.DType) error {
	if !Floating(from) || !Floating(to) {
		return fmt.Errorf("convert: %s to %s is not supported", from, to)
	}
	in, out := from.Size(), to.Size()
	n := len(src) / in
	if len(src)%in != 0 || len(dst) != n*out {
		return fmt.Errorf("convert: %d bytes of %s into %d bytes of %s", len(src), from, len(dst), to)
	}
	if from == to {
		copy(dst, src)
		return nil
	}
	nan := uint16(scalarNaN)
	if from == safetensors.F32 {
		nan = vectorNaN
	}
	for i := 0; i < n; i++ {
		f := read(src[i*in:], from)
		write(dst[i*out:], to, f, nan)
	}
	return nil
}

// The bf16 NaN of torch's vectorised float32 kernel, and of its scalar cast.
const (
	vectorNaN = 0xffff
	scalarNaN = 0x7fc0
)

// read returns an element as float32 bits.
func read(b []byte, d safetensors.DType) uint32 {
	switch d {
	case safetensors.F32:
		return binary.LittleEndian.Uint32(b)
	case safetensors.BF16:
		return uint32(binary.LittleEndian.Uint16(b)) << 16
	case safetensors.F16:
		return halfToFloat(binary.LittleEndian.Uint16(b))
	default: // F64
		return math.Float32bits(float32(math.Float64frombits(binary.LittleEndian.Uint64(b))))
	}
}

func write(b []byte, d safetensors.DType, f uint32, bf16NaN uint16) {
	switch d {
	case safetensors.F32:
		binary.LittleEndian.PutUint32(b, f)
	case safetensors.BF16:
		binary.LittleEndian.PutUint16(b, FloatToBF16(f, bf16NaN))
	case safetensors.F16:
		binary.LittleEndian.PutUint16(b, FloatToHalf(f))
	default: // F64
		binary.LittleEndian.PutUint64(b, math.Float64bits(float64(math.Float32frombits(f))))
	}
}

// FloatToBF16 rounds float32 bits to bfloat16 bits; a NaN becomes nan.
func FloatToBF16(u uint32, nan uint16) uint16 {
	if u&0x7fffffff > 0x7f800000 {
		return nan
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// FloatToHalf rounds float32 bits to IEEE half bits.
func FloatToHalf(u uint32) uint16 {
	sign := uint16(u>>16) & 0x8000
	abs := u & 0x7fffffff
	switch {
	case abs > 0x7f800000: // NaN: quiet, payload truncated
		return sign | 0x7e00 | uint16(abs>>13)&0x3ff
	case abs >= 0x477ff000: // rounds to ≥ 65520: infinity
		return sign | 0x7c00
	case abs >= 0x38800000: // normal half
		// Rebias the exponent (127 → 15) and round the 13 dropped bits.
		v := abs - 0x38000000
		return sign | uint16((v+0xfff+(v>>13)&1)>>13)
	case abs < 0x33000000: // below half the smallest subnormal: ±0
		return sign
	default: // subnormal half
		exp := abs >> 23
		mant := abs&0x7fffff | 0x800000
		shift := 126 - exp // 14 + 13 - (exp - 127) ... the value is mant · 2^(exp-150)
		half := mant >> shift
		rem := mant & (1<<shift - 1)
		mid := uint32(1) << (shift - 1)
		if rem > mid || rem == mid && half&1 == 1 {
			half++
		}
		return sign | uint16(half)
	}
}

// halfToFloat widens IEEE half bits to float32 bits, exactly.
func halfToFloat(h uint16) uint32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f && mant == 0:
		return sign | 0x7f800000
	case exp == 0x1f: // NaN: quieted, payload kept
		return sign | 0x7fc00000 | mant<<13
	case exp != 0:
		return sign | (exp+112)<<23 | mant<<13
	case mant == 0:
		return sign
	}
	// subnormal: normalise
	e := uint32(113)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return sign | e<<23 | (mant&0x3ff)<<13
}
