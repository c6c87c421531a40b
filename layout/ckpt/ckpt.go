// Package ckpt is the checkpoint model every format reader produces: global
// tensors made of chunks, each chunk backed by a byte source inside a shard
// file. Everything downstream (the view plan, byte assembly, inspect, the FUSE
// layer) works on this model and never on a format directly.
//
// A tensor's chunks are its index, and all of a view's memory that grows
// with the checkpoint: Chunks keeps them flat (every chunk's offsets and
// sizes in one array per tensor; sources in one slice, or in the format's
// own array through a SourceTable, with no geometry of their own), and
// Checkpoint.ResidentBytes counts them for a mount's metadata budget.
package ckpt

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/safetensors"
)

// Format names a checkpoint flavour.
type Format string

const (
	FormatTorchDCP  Format = "torch-dcp"
	FormatHFSharded Format = "hf-sharded-safetensors"
	FormatMegatron  Format = "megatron-torch_dist"
	FormatPlainHF   Format = "hf-safetensors"
	FormatStages    Format = "pipeline-stages"
	FormatTorchSave Format = "torch-save"
	// FormatTorchStateDict is a torch.save state dict under any name
	// (model.pt, a Lightning .ckpt), recognised by what it holds.
	FormatTorchStateDict Format = "torch-save-state-dict"
	// FormatMetaLlama is Meta's original Llama format: params.json and
	// consolidated.NN.pth per model-parallel rank.
	FormatMetaLlama Format = "meta-llama"
	// FormatTrainerDeepSpeed is a folder whose `latest` names its
	// DeepSpeed checkpoint (Trainer's checkpoint-N/ with DeepSpeed).
	FormatTrainerDeepSpeed Format = "hf-trainer-deepspeed"
	// FormatTrainerFSDP is Trainer's checkpoint-N/ with FSDP: the model in
	// pytorch_model_fsdp_0/ (accelerate's sharded DCP).
	FormatTrainerFSDP Format = "hf-trainer-fsdp"
	// FormatMegatronLegacy is Megatron-LM's --ckpt-format torch:
	// mp_rank_*/model_optim_rng.pt per model-parallel rank.
	FormatMegatronLegacy Format = "megatron-legacy"
	// FormatDeepSpeed is a DeepSpeed ZeRO 1/2/3 checkpoint (global_stepN/).
	FormatDeepSpeed Format = "deepspeed-zero"
	// FormatDeepSpeedUniversal is DeepSpeed's universal checkpoint
	// (ds_to_universal: zero/<param>/fp32.pt).
	FormatDeepSpeedUniversal Format = "deepspeed-universal"
)

// Reader is one checkpoint format: how to recognise a directory of it and
// how to open one.
type Reader interface {
	Format() Format
	// Detect reports whether dir holds a checkpoint of this format, looking
	// at names and at most a few small files: cheap enough to run on every
	// directory lookup of a mount. A checkpoint it accepts may still fail to
	// open (a corrupt file), which Open then reports.
	Detect(dir source.Tree) bool
	Open(dir source.Tree) (*Checkpoint, error)
	// Internal reports whether an entry of a checkpoint directory is part of
	// the format itself (shards, indexes), which an HF view replaces.
	Internal(name string) bool
}

// ErrInvalid is the sentinel for checkpoints whose metadata contradicts itself
// or the files on disk (holes, overlaps, out-of-bounds chunks, short files).
var ErrInvalid = errors.New("ckpt: invalid checkpoint")

// Checkpoint is one opened checkpoint directory.
type Checkpoint struct {
	// Dir names the directory in messages (a path or URL).
	Dir    string
	Format Format
	// Tensors in checkpoint order (the order of the format's own index).
	Tensors []*Tensor
	// Left are tensors of optimizer state the format left out of Tensors
	// (OpenOptions.LeaveOptimizer), in checkpoint order; never in a view.
	Left []LeftTensor
	// Objects are non-tensor items (pickled Python values); never in a view.
	Objects []Object
	// Skipped lists tensors that exist but cannot be served, with the reason
	// (for example a dtype safetensors cannot represent).
	Skipped []Skipped
	// Files owns the open shard files; Close releases them.
	Files *FileSet
	// Sidecars are extra files (config.json, tokenizer files, ...) that belong
	// in the HF view, by view name → name in Files.
	Sidecars map[string]string
	// FileIndex, when the checkpoint carries one (NeMo's
	// fqn_to_file_index_mapping.json), maps tensor name → 1-based file index.
	FileIndex map[string]int
	// Passthrough, when set, lists files that are the HF view as they are
	// (a plain HF directory): the view shows them instead of generated files.
	Passthrough []string
	// Parts are checkpoints this one merges (pipeline stages), closed with it.
	Parts []*Checkpoint
	// ModTime is when the checkpoint was written, where its format keeps an
	// index file that says so (DCP's .metadata, Megatron's metadata.json: the
	// newest); zero otherwise, and a view takes its directory's.
	ModTime time.Time
	// Record is what the checkpoint records of its model beside its tensors
	// (Megatron-LM's training arguments), as its format reads it; nil when
	// it records nothing.
	Record ModelRecord
	// Warnings are problems that do not stop the checkpoint from being
	// shown (an unreadable common.pt, say), one line each.
	Warnings []string
	// HFConfig is the model's HF config.json held inside the checkpoint
	// (Composer's HuggingFaceModel saves it in its state): the view's
	// config.json when none lies beside the checkpoint; nil when it holds
	// none.
	HFConfig []byte
}

// ModelRecord is what a checkpoint records of its model beside its
// tensors, read by its format: the sizes a mapping needs and the HF
// config.json of the model.
type ModelRecord interface {
	// Params are the model's sizes by the mapping language's names (heads,
	// kv_heads, head_dim, hidden, vocab, layers, ffn; a name missing is not
	// known), whether the output projection is tied to the input
	// embeddings, and what was assumed, one line each.
	Params() (params map[string]int64, tied bool, notes []string)
	// HFConfig writes the HF config.json of the model as the mapping
	// target describes shows it; an error says what HF cannot express.
	HFConfig(target HFTarget) ([]byte, error)
	// Source says where it was read from, for inspect.
	Source() string
}

// HFTarget is what a mapping makes of a checkpoint, as HFConfig needs it.
type HFTarget struct {
	// Mapping names the mapping.
	Mapping string
	// MoE is the HF mixture-of-experts family the mapping's rules make
	// (MoEMixtral, MoEQwen); "" for a dense model.
	MoE string
	// Model is the HF model the mapping's rules make whatever the
	// checkpoint's arguments say (ModelLlama); "" when they decide it.
	Model string
}

// ModelLlama is LlamaForCausalLM: what Meta's and torchtitan's Llama names
// become.
const ModelLlama = "llama"

// The HF mixture-of-experts families a mapping makes.
const (
	// MoEMixtral is MixtralForCausalLM.
	MoEMixtral = "mixtral"
	// MoEQwen is Qwen3MoeForCausalLM (QK norms) or Qwen2MoeForCausalLM (QKV
	// biases and a gated shared expert): one set of names, the model's
	// arguments tell which.
	MoEQwen = "qwen-moe"
)

// Close releases every open shard file.
func (c *Checkpoint) Close() error {
	if c == nil {
		return nil
	}
	var first error
	for _, p := range c.Parts {
		if err := p.Close(); err != nil && first == nil {
			first = err
		}
	}
	if c.Files != nil {
		if err := c.Files.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Tensor is a global tensor assembled from chunks.
type Tensor struct {
	// Name is the flattened key as stored (the DCP FQN, or safetensors key).
	Name string
	// Path is the original nesting of Name (DCP planner_data), one element per
	// level; nil when the format has no nesting information.
	Path  []string
	DType safetensors.DType
	Shape []int64
	// Chunks tile Shape exactly: no holes, no overlaps (checked by Validate).
	Chunks Chunks

	// valid holds a *validMark, set by Validate (valid.go); an atomic.Value
	// so that a tensor can still be copied, its mark with it.
	valid atomic.Value
}

// Chunk is one box of a global tensor stored contiguously in C order (a
// tensor stores its chunks flat: Chunks).
type Chunk struct {
	Offsets []int64
	Sizes   []int64
	Source  Source
}

// Source reads a chunk's raw row-major little-endian bytes. Offsets are
// relative to the first byte of the chunk. Implementations resolve their
// location lazily on first use and remember it, and are pointers: a reader
// tells sources apart by identity (the read plan merges reads of one).
type Source interface {
	io.ReaderAt
	// String names where the bytes live, for error messages.
	String() string
}

// Locator is a Source that can say where its bytes lie in a checkpoint
// file, so that a reader can plan reads of many sources together (merge
// neighbours, read each file once per batch) instead of one ReadAt each.
type Locator interface {
	Source
	// Locate returns where the source's first byte is; false when its
	// bytes are not one range of one file (compressed, or spread over
	// several), and must be read with ReadAt.
	Locate() (Location, bool, error)
}

// Filler is a Locator whose first Locate may read some of its bytes anyway
// (a small DCP record's data sits in the window its headers are read in).
// LocateFill is Locate that, when this very call read the source's bytes
// [off, off+n) (n the parts' total length) while locating it, also copies
// them into parts and says so (filled), so that the reader does not read
// them again. A locating that read the file may leave its freshness check
// to the caller (Location.Unchecked): a reader locating many sources of a
// file checks it once after all its reads instead of once per source.
type Filler interface {
	Locator
	LocateFill(off int64, parts [][]byte) (loc Location, ok, filled bool, err error)
}

// Location is where a Locator's bytes lie.
type Location struct {
	File   *File
	Offset int64
	// Whole, when set, checks the CRC32 of all of the source's bytes
	// against the one the format records: a reader that reads them whole
	// calls it, as the source's own ReadAt does.
	Whole WholeChecker
	// Unchecked (LocateFill only): this call read File to locate the
	// source and did not check its freshness. The bytes filled may be used
	// only once a File.Check made after the call passes (File.ReadRanges
	// checks after its reads). Reads at the location are checked as any
	// other: one after a change fails, however the location was found.
	Unchecked bool
}

// WholeChecker checks the CRC32 of all of a source's bytes.
type WholeChecker interface {
	CheckWhole(crc uint32) error
}

// Object is a non-tensor item (DCP BYTE_IO).
type Object struct {
	Name   string
	Path   []string
	Size   int64
	Source string // where it is stored, for messages and inspect
	// Bytes are its pickled bytes as stored, Size of them; nil when it is
	// stored transformed (compressed).
	Bytes io.ReaderAt `json:"-"`
}

// Skipped is a tensor left out of every view, with the reason.
type Skipped struct {
	Name   string
	Reason string
}

// NumElements returns the product of shape, or an error on overflow or a
// negative dimension.
func NumElements(shape []int64) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("%w: negative dimension %d in shape %v", ErrInvalid, d, shape)
		}
		if d != 0 && n > (1<<62)/d {
			return 0, fmt.Errorf("%w: shape %v overflows", ErrInvalid, shape)
		}
		n *= d
	}
	return n, nil
}

// ByteSize is the number of raw bytes of the tensor.
func (t *Tensor) ByteSize() int64 {
	n, _ := NumElements(t.Shape)
	return n * int64(t.DType.Size())
}

// ShardedDims lists the dimensions along which the chunks split the tensor.
func (t *Tensor) ShardedDims() []int {
	var dims []int
	for d := range t.Shape {
		for _, c := range t.Chunks.All() {
			if c.Offsets[d] != 0 || c.Sizes[d] != t.Shape[d] {
				dims = append(dims, d)
				break
			}
		}
	}
	return dims
}

// Validate checks that the tensor's chunks tile its shape exactly: every chunk
// is in bounds and every element is in exactly one chunk (no overlap, no
// hole). Empty chunks (a zero size) are allowed anywhere, as torch writes
// them. An error names the first element covered twice, and two chunks that
// hold it, or the first element no chunk holds. Chunks that split the tensor
// along its first dimension only, in order (FSDP's), are proved to tile it
// in one pass; any other layout takes O(n log n) for n chunks (see
// coverage.go). A tensor that passes is marked so that CheckValid need not
// check it again while it is unchanged.
func (t *Tensor) Validate() error { return t.validate(true) }

// validate is Validate, with the one-pass proof for rows when fast is set
// (tests compare the verdicts without it).
func (t *Tensor) validate(fast bool) error {
	total, err := NumElements(t.Shape)
	if err != nil {
		return fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	if t.DType.Size() <= 0 {
		return fmt.Errorf("%w: tensor %q: unknown dtype %q", ErrInvalid, t.Name, t.DType)
	}
	if total > (1<<62)/int64(t.DType.Size()) {
		return fmt.Errorf("%w: tensor %q: byte size of shape %v overflows", ErrInvalid, t.Name, t.Shape)
	}
	// One pass checks every chunk's bounds and whether the non-empty chunks
	// are rows of the first dimension, each starting where the one before
	// ended: then they tile the shape when the last ends at its end.
	rows := fast && len(t.Shape) > 0
	var next int64 // along dimension 0, where the next non-empty chunk must start
	for i := range t.Chunks.Len() {
		off, sizes := t.Chunks.box(i)
		if len(off) != len(t.Shape) || len(sizes) != len(t.Shape) {
			return fmt.Errorf("%w: tensor %q: chunk %d has rank %d/%d, tensor has rank %d",
				ErrInvalid, t.Name, i, len(off), len(sizes), len(t.Shape))
		}
		empty, full := false, true
		for d, s := range t.Shape {
			if off[d] < 0 || sizes[d] < 0 || off[d] > s || sizes[d] > s-off[d] {
				return fmt.Errorf("%w: tensor %q: chunk %d (offsets %v sizes %v) is outside shape %v",
					ErrInvalid, t.Name, i, off, sizes, t.Shape)
			}
			empty = empty || sizes[d] == 0
			full = full && (d == 0 || off[d] == 0 && sizes[d] == s)
		}
		if rows && !empty {
			if rows = full && off[0] == next; rows {
				next += sizes[0] // in bounds: at most t.Shape[0]
			}
		}
	}
	if rows && next == t.Shape[0] {
		t.markValid()
		return nil
	}
	if err := t.coverage(total); err != nil {
		return err
	}
	t.markValid()
	return nil
}

// coverage is Validate's general check, on chunks known to be in bounds.
func (t *Tensor) coverage(total int64) error {
	var sum int64 // saturates: only messages use it
	nonEmpty := make([]int, 0, t.Chunks.Len())
	for i := range t.Chunks.Len() {
		_, sizes := t.Chunks.box(i)
		n, _ := NumElements(sizes)
		if n > 0 {
			nonEmpty = append(nonEmpty, i)
		}
		sum = min(sum, 1<<62-n) + n
	}
	elem, count, bad, err := uncovered(t.Shape, &t.Chunks, nonEmpty)
	switch {
	case err != nil:
		return fmt.Errorf("%w: tensor %q: %d chunks: %w", ErrInvalid, t.Name, len(nonEmpty), err)
	case !bad:
		return nil
	case count > 1:
		a, b := holding(&t.Chunks, nonEmpty, elem)
		return fmt.Errorf("%w: tensor %q: chunks %d and %d overlap (both hold element %v)", ErrInvalid, t.Name, a, b, elem)
	case sum < total:
		return fmt.Errorf("%w: tensor %q: chunks cover %d of %d elements (hole in chunk coverage): no chunk holds element %v",
			ErrInvalid, t.Name, sum, total, elem)
	default:
		return fmt.Errorf("%w: tensor %q: no chunk holds element %v (hole in chunk coverage) and chunks overlap elsewhere: their sizes add up to %d of %d elements",
			ErrInvalid, t.Name, elem, sum, total)
	}
}
