// Package torchdcp is the PyTorch Distributed Checkpoint format
// (FileSystemWriter layout: a .metadata pickle plus *.distcp shard files of
// torch.save records), in both directions, shaped like archive/zip:
//
//   - names.go: the format's file names, and which names are its own;
//     dtypes.go: the dtypes a record can hold (torch's storage classes).
//   - metadata*.go: the .metadata model, DecodeMetadata (the restricted
//     pickle VM, every field checked) and EncodeMetadata;
//     metadatastream.go: how Open decodes it: the VM hands each chunk and
//     storage entry to a sink that keeps them in flat per-tensor arrays
//     (no tree of pickle values, no map of storage keys), with the same
//     field decoders, and the general decoder's answer for anything else.
//   - record*.go: a chunk's record (a torch.save archive), located
//     (record.go) and read in place (recordsource.go; a small zstd record
//     decompressed is kept in the checkpoint's bounded recordcache.go),
//     and written (recordwrite.go: RecordWriter); dcptest writes
//     checkpoints of such records for tests.
//   - open.go: Open and the registry's Reader: a checkpoint as the ckpt
//     model.
//
// Open parses .metadata and checks everything that is cheap to check
// (storage entries, file confinement and sizes, chunk tiling) without
// reading shard contents. Optimizer state (by planner_data) that the
// caller will not show (ckpt.OpenOptions) is checked the same way, then
// kept only as ckpt.Left. Each chunk's bytes live inside a torch.save zip
// record; where exactly is found on the chunk's first read and remembered,
// in a fixed size that the checkpoint counts from its open (ResidentBytes),
// as it counts the bounds of what reads keep besides.
// The commit protocol of a writer (placement, numbering, .metadata written
// last) is dcpwrite's.
package torchdcp

import (
	"fmt"
	"math"
	"strings"

	"github.com/ckptfs/ckptfs/internal/par"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchsave"
)

// Options tune OpenWith. The zero value is what Open uses.
type Options struct {
	// Format is stamped on the checkpoint (default ckpt.FormatTorchDCP).
	Format ckpt.Format
	// TempDir receives decompressed zstd records larger than 1 MiB, as
	// unlinked files ("" means os.TempDir()).
	TempDir string
	// MaxMetadataBytes bounds the .metadata file (default 1 GiB).
	MaxMetadataBytes int64
	// Open says what the caller will use (ckpt.OpenOptions): optimizer
	// state (by planner_data) left out of Tensors is checked as the other
	// tensors are, then kept only as a ckpt.LeftTensor.
	Open ckpt.OpenOptions
}

// Reader is the torch DCP format.
var Reader ckpt.Reader = reader{}

type reader struct{}

func (reader) Format() ckpt.Format { return ckpt.FormatTorchDCP }

// Detect reports whether dir looks like a DCP checkpoint: it has a .metadata
// file.
func (reader) Detect(dir source.Tree) bool { return Detect(dir) }

func (reader) Internal(name string) bool { return IsInternal(name) }

func (reader) Open(dir source.Tree) (*ckpt.Checkpoint, error) { return OpenTree(dir, Options{}) }

func (reader) OpenWith(dir source.Tree, o ckpt.OpenOptions) (*ckpt.Checkpoint, error) {
	return OpenTree(dir, Options{Open: o})
}

// Detect reports whether dir has a .metadata (a link to one that leads
// outside the source counts, so that Open reports it).
func Detect(dir source.Tree) bool { return source.Exists(dir, MetadataFile) }

// OpenTree opens the DCP checkpoint in the directory tree dir.
//
// Rank-local checkpoints (dcp.save(use_collectives=False): one
// __<rank>.metadata per rank and no .metadata) are not supported: each file
// describes only its rank's part.
func OpenTree(dir source.Tree, opts Options) (*ckpt.Checkpoint, error) {
	if opts.MaxMetadataBytes <= 0 {
		opts.MaxMetadataBytes = DefaultMaxMetadataBytes
	}
	var m *Metadata
	var st *stream
	err := withMetadata(dir, opts.MaxMetadataBytes, func(b []byte, release func(lo, hi int)) error {
		var err error
		s := newStream()
		s.release = release
		if m, st, err = decodeMetadataStream(b, opts.MaxMetadataBytes, s); err != nil {
			return fmt.Errorf("torchdcp: %s: %w", dir.Path(MetadataFile), err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return openDecoded(dir, m, st, opts)
}

// OpenDecoded opens the DCP checkpoint in dir whose .metadata m is, decoded
// already (OpenTree, or a writer's view of what it has just committed,
// without reading .metadata back), checking m against the files in dir.
func OpenDecoded(dir source.Tree, m *Metadata, opts Options) (*ckpt.Checkpoint, error) {
	return openDecoded(dir, m, nil, opts)
}

// openDecoded is OpenDecoded of m, whose storage entries are st's when st
// is not nil (metadatastream.go).
func openDecoded(dir source.Tree, m *Metadata, st *stream, opts Options) (*ckpt.Checkpoint, error) {
	if opts.Format == "" {
		opts.Format = ckpt.FormatTorchDCP
	}
	where := dir.Path(MetadataFile)
	c := &ckpt.Checkpoint{Dir: dir.Path("."), Format: opts.Format, Files: ckpt.NewFileSet(dir)}
	items := make([]built, len(m.Items))
	buildItems(builder{m: m, st: st, c: c, opts: opts, records: newRecordCache()}, items)
	var unknown []string // "name (torch.X)" of tensors whose dtype torch does not have
	for i, it := range items {
		if it.err != nil { // the first item's error, as in one pass
			c.Close()
			return nil, fmt.Errorf("torchdcp: %s: %w", where, it.err)
		}
		switch {
		case it.unknown:
			tm := m.Items[i].Tensor
			unknown = append(unknown, fmt.Sprintf("%q (torch.%s)", m.Items[i].FQN, tm.Properties.DType))
		case it.object != nil:
			c.Objects = append(c.Objects, *it.object)
		case it.skipped != nil:
			c.Skipped = append(c.Skipped, *it.skipped)
		case it.left != nil:
			c.Left = append(c.Left, *it.left)
		case it.tensor != nil:
			c.Tensors = append(c.Tensors, it.tensor)
		}
	}
	countRecords(c)
	if len(unknown) > 0 {
		c.Close()
		return nil, fmt.Errorf("torchdcp: %s: %w", where, invalidf("%d tensors have a dtype torch does not have: %s",
			len(unknown), strings.Join(firstFew(unknown, 8), ", ")))
	}
	c.ModTime = source.ModTime(dir, MetadataFile)
	if cfg, err := torchsave.ObjectsConfig(c.Objects); err != nil {
		c.Warnings = append(c.Warnings, fmt.Sprintf("%s: no config.json from the checkpoint: %v", c.Dir, err))
	} else {
		c.HFConfig = cfg
	}
	return c, nil
}

// knownDType reports whether name is a torch dtype: one safetensors has, or
// one left out of views with a reason.
func knownDType(name string) bool {
	_, _, ok := dtypeOf(name)
	return ok || torchOnlyDTypes[name]
}

// firstFew is the first n of names, then how many more there are.
func firstFew(names []string, n int) []string {
	if len(names) <= n {
		return names
	}
	return append(names[:n:n], fmt.Sprintf("and %d more", len(names)-n))
}

// built is what one item of .metadata makes of the checkpoint (one of
// these set), or why it cannot be shown.
type built struct {
	tensor  *ckpt.Tensor
	left    *ckpt.LeftTensor
	skipped *ckpt.Skipped
	object  *ckpt.Object
	unknown bool // a dtype torch does not have
	err     error
}

// Building a large checkpoint's model (each chunk's storage, file and
// bounds, each tensor's tiling) is serial work after the decode while the
// other cores idle; from buildParallelChunks chunks on, items are built on
// up to buildWorkers cores (vars: tests build any checkpoint in parallel).
var (
	buildParallelChunks = 1 << 16
	buildWorkers        = par.Cores()
)

// buildItems builds each item of b.m into out, on several cores where the
// stream holds the storage (b.st) and the chunks are many: each worker has
// its own builder (its file lookups), and takes the next item not taken.
// After an error no worker takes a further item; every item before it
// was taken, so the first error by index is the one a single pass finds.
func buildItems(b builder, out []built) {
	chunks := 0
	for _, it := range b.m.Items {
		if it.Tensor != nil {
			chunks += it.Tensor.numChunks()
		}
	}
	workers := buildWorkers
	if b.st == nil || chunks < buildParallelChunks {
		workers = 1 // without the stream, lookups follow the items' order (lookupFrom)
	}
	bs := make([]builder, workers) // each worker's own: its file lookups
	for w := range bs {
		bs[w] = b
	}
	par.Each(len(out), workers, func(w, i int) bool {
		out[i] = bs[w].item(b.m.Items[i])
		return out[i].err == nil
	})
}

// item builds one item of .metadata.
func (b *builder) item(it Item) (out built) {
	switch {
	case it.Tensor != nil && !knownDType(it.Tensor.Properties.DType):
		out.unknown = true
	case it.Tensor == nil:
		out.err = b.object(it.FQN, &out)
	default:
		out.err = b.tensor(it.FQN, it.Tensor, &out)
	}
	return out
}

type builder struct {
	m    *Metadata
	st   *stream // where the storage entries are, when not in m
	c    *ckpt.Checkpoint
	opts Options
	next int // the storage entry after the last one looked up: see lookupFrom
	// files are the shard files by the name the metadata gives, so that
	// each of a million chunks is one map lookup (FileSet.Get cleans the
	// name and takes a lock).
	files map[string]*ckpt.File
	// stFiles are the same by the stream's file index (nil: not yet).
	stFiles []*ckpt.File
	// records keeps the checkpoint's small decompressed zstd records.
	records *recordCache
}

// countRecords makes the first tensor kept that has zstd chunks count the
// checkpoint's decompressed records (recordSource.ResidentBytes).
func countRecords(c *ckpt.Checkpoint) {
	for _, t := range c.Tensors {
		if t.Chunks.Len() == 0 {
			continue
		}
		if src, ok := t.Chunks.Source(0).(*recordSource); ok && src.t.records != nil {
			src.t.countsRecords = true
			return
		}
	}
}

// lookup is m.Lookup of chunk i of tensor fqn, at offset (i < 0, offset
// nil: the object fqn), trying the entry after the last one found first.
func (b *builder) lookup(fqn string, i int, offset []int64) (StorageInfo, bool) {
	if b.st != nil {
		return b.st.lookup(fqn, i)
	}
	i, ok := b.m.lookupFrom(b.next, fqn, offset)
	if !ok {
		return StorageInfo{}, false
	}
	b.next = i + 1
	return b.m.Storage[i].Info, true
}

// transform classifies transform_descriptors: none, or zstd.
func transform(desc []string) (zstd bool, err error) {
	switch len(desc) {
	case 0:
		return false, nil
	case 1:
		// name[@domain]/version; ZStandard accepts major version 1.
		name, version, _ := strings.Cut(desc[0], "/")
		major, _, _ := strings.Cut(version, ".")
		if name == "stream.zstd" && major == "1" {
			return true, nil
		}
	}
	return false, invalidf("unsupported transform_descriptors %q", desc)
}

// file resolves and bounds-checks one storage entry. what names the entry
// in errors; it is a function because a checkpoint can have millions of
// entries, and formatting each name up front was a measurable part of
// opening one.
func (b *builder) file(what func() string, info StorageInfo) (*ckpt.File, error) {
	f, ok := b.files[info.RelativePath]
	if !ok {
		var err error
		if f, err = b.c.Files.Get(info.RelativePath); err != nil {
			return nil, fmt.Errorf("%s: %w", what(), err)
		}
		if b.files == nil {
			b.files = map[string]*ckpt.File{}
		}
		b.files[info.RelativePath] = f
	}
	return f, b.within(what, f, info)
}

// fileAt is file for a storage entry of the stream whose file index is
// i: a slice index, not a map lookup of its name, per chunk.
func (b *builder) fileAt(what func() string, i int32, info StorageInfo) (*ckpt.File, error) {
	if int(i) < len(b.stFiles) && b.stFiles[i] != nil {
		f := b.stFiles[i]
		return f, b.within(what, f, info)
	}
	f, err := b.file(what, info)
	if err != nil {
		return nil, err
	}
	if int(i) >= len(b.stFiles) {
		b.stFiles = append(b.stFiles, make([]*ckpt.File, int(i)+1-len(b.stFiles))...)
	}
	b.stFiles[i] = f
	return f, nil
}

// within checks that info's record lies within f.
func (b *builder) within(what func() string, f *ckpt.File, info StorageInfo) error {
	loc := func() string { return fmt.Sprintf("%s@%d+%d", f.Rel, info.Offset, info.Length) }
	if info.Offset < 0 || info.Length < 0 {
		return invalidf("%s stored in %s: negative offset or length", what(), loc())
	}
	if info.Offset > f.Size() || info.Length > f.Size()-info.Offset {
		return invalidf("%s stored in %s past end of file (size %d)", what(), loc(), f.Size())
	}
	return nil
}

func (b *builder) object(fqn string, out *built) error {
	what := fmt.Sprintf("object %q", fqn)
	info, ok := b.lookup(fqn, -1, nil)
	if !ok {
		return invalidf("%s has no storage_data entry", what)
	}
	if _, err := transform(info.TransformDescriptors); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	f, err := b.file(func() string { return what }, info)
	if err != nil {
		return err
	}
	o := ckpt.Object{Name: fqn, Path: b.m.PlannerData[fqn], Size: info.Length,
		Source: fmt.Sprintf("%s@%d+%d", f.Rel, info.Offset, info.Length)}
	if len(info.TransformDescriptors) > 0 {
		o.Source += " (zstd)"
	} else {
		o.Bytes = &ckpt.Section{File: f, Offset: info.Offset, Length: info.Length}
	}
	out.object = &o
	return nil
}

func (b *builder) tensor(fqn string, tm *TensorMetadata, out *built) error {
	dt, elem, ok := dtypeOf(tm.Properties.DType)
	if !ok {
		out.skipped = &ckpt.Skipped{
			Name:   fqn,
			Reason: fmt.Sprintf("dtype %s has no safetensors equivalent", tm.Properties.DType),
		}
		return nil
	}
	t := &ckpt.Tensor{Name: fqn, Path: b.m.PlannerData[fqn], DType: dt, Shape: tm.Size}
	n := tm.numChunks()
	if n > math.MaxInt32 {
		return invalidf("tensor %q: %d chunks", fqn, n)
	}
	if tm.flat != nil {
		// The stream's array, in the form ckpt.Chunks keeps.
		t.Chunks = ckpt.ChunksOf(n, len(tm.Size), tm.flat)
	} else {
		t.Chunks.Grow(n, len(tm.Size))
		for i := range n {
			off, size := tm.chunk(i)
			t.Chunks.Add(off, size, nil)
		}
	}
	// Tiling first: it also bounds every size used below.
	if err := t.Validate(); err != nil {
		return err
	}
	// Optimizer state the caller will not show is checked as the others,
	// then described and dropped.
	leave := b.opts.Open.LeaveOptimizer && ckpt.IsOptimizerPath(t.Path)
	// One allocation for the sources of all chunks: a tensor can have
	// hundreds of thousands.
	var srcs []recordSource
	if !leave {
		srcs = make([]recordSource, n)
	}
	rt := &recordTensor{name: fqn, dtype: tm.Properties.DType, elemSize: elem, tmpDir: b.opts.TempDir, files: b.c.Files, chunks: &t.Chunks}
	var st *streamTensor // the stream's storage of fqn's chunks
	if b.st != nil {
		st = b.st.byFQN[fqn]
	}
	// One closure for every chunk's name in errors, made once: per chunk,
	// it was an allocation each.
	var offs []int64
	what := func() string { return fmt.Sprintf("tensor %q: chunk %s", fqn, formatOffsets(offs)) }
	// The chunks read from tm, as t.Chunks has them: its iterator's
	// call per chunk was a tenth of this loop.
	for i := range n {
		var sizes []int64
		offs, sizes = tm.chunk(i)
		var info StorageInfo
		var f *ckpt.File
		var err error
		if b.st != nil {
			var sc storedChunk
			if st != nil && i < len(st.store) {
				sc = st.store[i]
			}
			if st == nil || i >= len(st.store) || sc.file < 0 {
				return invalidf("%s has no storage_data entry", what())
			}
			info = b.st.info(sc)
			f, err = b.fileAt(what, sc.file, info)
		} else {
			var ok bool
			if info, ok = b.lookup(fqn, i, offs); !ok {
				return invalidf("%s has no storage_data entry", what())
			}
			f, err = b.file(what, info)
		}
		zstd, terr := transform(info.TransformDescriptors)
		if terr != nil {
			return fmt.Errorf("%s: %w", what(), terr)
		}
		if err != nil {
			return err
		}
		numel, _ := ckpt.NumElements(sizes) // Validate bounded it
		nbytes := numel * elem
		if !zstd && info.Length < nbytes {
			return invalidf("%s stored in %s@%d+%d: record too short for %d bytes of data",
				what(), f.Rel, info.Offset, info.Length, nbytes)
		}
		if leave {
			continue
		}
		if zstd {
			rt.records = b.records
		}
		srcs[i] = recordSource{t: rt, file: f, off: info.Offset, length: info.Length, zstd: zstd, i: int32(i)}
	}
	if leave {
		l := ckpt.Leave(t)
		out.left = &l
		return nil
	}
	rt.srcs = srcs
	t.Chunks.SetSources(rt)
	out.tensor = t
	return nil
}
