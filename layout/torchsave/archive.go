package torchsave

// The exported face of the torch.save reader, for formats whose files are
// torch.save archives of something other than an HF state dict (a Megatron-LM
// model_optim_rng.pt, a DeepSpeed *_optim_states.pt): open an archive, decode
// its data.pkl with the restricted VM, and resolve the tensors in it to byte
// ranges of their storages, read in place as this package reads its own.

import (
	"fmt"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/torchzip"
	"github.com/ckptfs/ckptfs/safetensors"
)

// Archive is one opened torch.save file: its zip directory, checked by
// torchzip.Open, and the storages its tensors resolved to, by key.
type Archive struct {
	z        *torchzip.Archive
	file     *ckpt.File
	storages map[string]*storage
}

// OpenArchive reads f's zip directory (no data.pkl, no tensor bytes)
// through torchzip.Open, which checks every entry.
func OpenArchive(f *ckpt.File) (*Archive, error) {
	a, err := openArchive(f)
	if err != nil {
		return nil, fmt.Errorf("%w: torchsave: %s: %w", ckpt.ErrInvalid, f.Path, err)
	}
	return a, nil
}

// File is the archive's file.
func (x *Archive) File() *ckpt.File { return x.file }

// Decode decodes data.pkl (bounded, nothing executed): storages are
// *torchzip.Storage, tensors the inert rebuild calls Tensor resolves.
func (x *Archive) Decode() (any, error) {
	v, err := x.decode()
	if err != nil {
		return nil, fmt.Errorf("%w: torchsave: %s: %w", ckpt.ErrInvalid, x.file.Path, err)
	}
	return v, nil
}

// Tensor is a tensor of an archive: its dtype and shape, and where its raw
// C-order bytes are.
type Tensor struct {
	DType safetensors.DType
	Shape []int64
	// Size is the tensor's byte size.
	Size int64
	s    stored
}

// Tensor resolves v, a value of the decoded data.pkl named what in
// messages (data.pkl["model"]["x"]), to a tensor stored in the archive. A
// tensor no view can show right (a dtype safetensors lacks, non-contiguous
// strides) gives the reason to leave it out instead, and a nil Tensor.
func (x *Archive) Tensor(v any, what string) (*Tensor, string, error) {
	s, skip, err := x.tensor(v, what)
	if err != nil {
		return nil, "", fmt.Errorf("%w: torchsave: %s: %w", ckpt.ErrInvalid, x.file.Path, err)
	}
	if skip != "" {
		return nil, skip, nil
	}
	return &Tensor{DType: s.dtype, Shape: s.shape, Size: s.size, s: s}, "", nil
}

// Source returns the bytes [off, off+n) of the tensor, named name in
// messages, as a chunk source; it panics when the range is outside the
// tensor (a caller's bug: bounds come from the tensor's shape).
func (t *Tensor) Source(name string, off, n int64) ckpt.Source {
	if off < 0 || n < 0 || off > t.Size || n > t.Size-off {
		panic(fmt.Sprintf("torchsave: range [%d, +%d) outside tensor %q of %d bytes", off, n, name, t.Size))
	}
	return &tensorSource{st: t.s.st, start: t.s.start + off, n: n, tensor: name}
}

// Storage names the storage holding the tensor and the tensor's byte range
// in it, so that callers can tell tensors sharing bytes apart.
func (t *Tensor) Storage() (key string, start, size int64) { return t.s.key, t.s.start, t.s.size }
