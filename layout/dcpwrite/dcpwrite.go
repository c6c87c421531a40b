// Package dcpwrite turns HuggingFace safetensors files into a PyTorch
// Distributed Checkpoint (DCP) that torch.distributed.checkpoint.load reads
// at any world size: the write path of ckptfs.
//
// A Dir is a DCP directory being written into. Each commit reshards one
// safetensors file into new shard files, one per rank that holds a piece of
// it (__{rank}_{n}.distcp, n reserved for this commit and never used
// before), each a concatenation of torch.save records, one per chunk, then
// rewrites .metadata atomically to cover everything committed so far.
// .metadata is the only commit point: shard files it does not name are
// garbage from a failed or killed writer, and Open (or RemoveStale)
// removes them.
//
// There is one reshard pipeline (reshard.go): Dir.Reshard runs it while the
// file is still being written, chunk by chunk as its bytes arrive, and
// Dir.Commit runs it over a complete file at close. Both give the same
// bytes.
//
// Placement (Target): every tensor is sharded on dim 0 the way FSDP2 shards
// parameters (torch.chunk sizes over WorldSize ranks, empty boxes for ranks
// past the data), unless a Rule picks another dim or replication, or Like
// supplies the boxes of an existing checkpoint.
//
// The bytes of .metadata and of each chunk's record are torchdcp's
// (EncodeMetadata, RecordWriter); this package decides what goes where and
// when it is committed.
//
// One Dir per directory: two writers (or two processes) must not share one.
package dcpwrite

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/safetensors"
)

var (
	// ErrExists is wrapped when a tensor name is already in the checkpoint.
	ErrExists = errors.New("dcpwrite: tensor already committed")
	// ErrDType is wrapped when a dtype has no torch equivalent that DCP can
	// store (F4, F6_*).
	ErrDType = errors.New("dcpwrite: dtype has no torch equivalent")
	// ErrUnsupported is wrapped when the directory holds a checkpoint this
	// writer cannot extend without losing information.
	ErrUnsupported = errors.New("dcpwrite: cannot extend this checkpoint")
)

// maxMetadataBytes bounds the .metadata read by OpenDir.
const maxMetadataBytes = torchdcp.DefaultMaxMetadataBytes

// outFile is what Dir writes to; tests substitute failing ones.
type outFile interface {
	io.Writer
	io.WriterAt
	Sync() error
	Close() error
}

// Dir is a DCP checkpoint directory being written into. Its methods are
// safe for concurrent use; commits are serialized.
type Dir struct {
	root   *source.Dir // every file of the directory is created, renamed and removed through it
	target Target
	limits *Limits

	// Lock order: commitMu, then mu. commitMu serializes the last step of
	// commits (check the names against what is committed, write .metadata);
	// mu
	// is held only to read or swap the committed state and to reserve file
	// numbers, so Committed and Reshard never wait for a commit's I/O.
	commitMu sync.Mutex
	mu       sync.Mutex
	meta     *torchdcp.Metadata // written holding commitMu and mu, read holding either; never mutated
	nextFile int                // GUARDED_BY(mu): n of the next reserved shard files (reserve)

	// Test hooks.
	create         func(name string, excl bool) (outFile, error)
	beforeMetadata func() error
	// removed lists the stale files Open deleted (for tests).
	removed []string
}

// Open opens the DCP directory root (opened already) for writing. It
// takes root: the Dir closes it, and Open does when it fails. An existing
// .metadata is the committed state: its entries are carried over into
// every later .metadata. Leftovers of an
// earlier writer that died mid-commit are removed: .metadata.tmp and every
// __{rank}_{n}.distcp that .metadata does not reference. A directory holding
// only torch's rank-local __{rank}.metadata files, or a .metadata with a
// root class other than Metadata (Megatron's MCoreMetadata) or custom
// planner_data, is refused (ErrUnsupported): rewriting it would drop data.
// The Dir's reshards count against limits (nil: limits of its own).
func Open(root *source.Dir, target Target, limits *Limits) (*Dir, error) {
	if limits == nil {
		limits = NewLimits()
	}
	d := &Dir{root: root, target: target, limits: limits}
	d.create = d.createFile
	if err := d.load(); err != nil {
		root.Close()
		return nil, err
	}
	return d, nil
}

// load reads the committed state and removes what an earlier writer left.
func (d *Dir) load() error {
	names, meta, err := loadCommitted(d.root)
	if err != nil {
		return err
	}
	d.meta = meta
	referenced := referencedFiles(d.meta)
	if d.removed, err = removeUnreferenced(d.root, names, referenced); err != nil {
		return err
	}
	// Commits number their files after every referenced one (present or not).
	for rel := range referenced {
		if _, k, ok := torchdcp.ParseShardName(rel); ok && k >= d.nextFile {
			d.nextFile = k + 1
		}
	}
	if len(d.removed) > 0 {
		if err := d.root.Sync("."); err != nil {
			return fmt.Errorf("dcpwrite: %w", err)
		}
	}
	return nil
}

// Close releases the directory.
func (d *Dir) Close() error { return d.root.Close() }

// Root is the directory, for the other files a writer keeps in it.
func (d *Dir) Root() *source.Dir { return d.root }

// loadCommitted reads what the DCP directory path holds: the names of its
// regular files and its committed state, .metadata (empty when there is
// none). A checkpoint this writer cannot extend without losing data is
// refused (ErrUnsupported): torch's rank-local __{rank}.metadata files and
// no .metadata, a root class other than Metadata (Megatron's
// MCoreMetadata), or planner_data that is not the default planner's. A
// .metadata that cannot be decoded is an error wrapping ckpt.ErrInvalid.
func loadCommitted(root *source.Dir) ([]string, *torchdcp.Metadata, error) {
	path := root.Path(".")
	names, err := readDirNames(root)
	if err != nil {
		return nil, nil, fmt.Errorf("dcpwrite: %w", err)
	}
	b, err := readLimited(root, torchdcp.MetadataFile, maxMetadataBytes)
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrNotExist):
		for _, n := range names {
			if torchdcp.IsRankLocalMetadata(n) {
				return nil, nil, fmt.Errorf("%w: %s holds rank-local %s and no .metadata", ErrUnsupported, path, n)
			}
		}
		return names, &torchdcp.Metadata{}, nil
	default:
		return nil, nil, fmt.Errorf("dcpwrite: %w", err)
	}
	m, err := torchdcp.DecodeMetadata(bytes.NewReader(b))
	if err != nil {
		return nil, nil, fmt.Errorf("dcpwrite: %s: %w", path, err)
	}
	switch {
	case m.Class.Name != "Metadata":
		return nil, nil, fmt.Errorf("%w: %s: root class %s (its extra fields would be lost on rewrite)", ErrUnsupported, path, m.Class)
	case m.PlannerErr != nil:
		return nil, nil, fmt.Errorf("%w: %s: %v (a custom planner's data cannot be carried over)", ErrUnsupported, path, m.PlannerErr)
	}
	return names, m, nil
}

func referencedFiles(m *torchdcp.Metadata) map[string]bool {
	referenced := map[string]bool{}
	for _, s := range m.Storage {
		referenced[filepath.Clean(s.Info.RelativePath)] = true
	}
	return referenced
}

// removeUnreferenced removes .metadata.tmp and the shard files of names
// that referenced does not hold, and returns the names removed.
func removeUnreferenced(root *source.Dir, names []string, referenced map[string]bool) ([]string, error) {
	var removed []string
	for _, n := range names {
		if _, _, shard := torchdcp.ParseShardName(n); n == torchdcp.MetadataTmp || (shard && !referenced[n]) {
			if err := root.Remove(n); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return removed, fmt.Errorf("dcpwrite: removing stale %s: %w", n, err)
			}
			removed = append(removed, n)
		}
	}
	return removed, nil
}

// RemoveStale removes what a writer killed mid-commit (or mid eager
// commit) left in the DCP directory root, as Open does: .metadata.tmp
// and the shard files .metadata does not name. It returns the names
// removed. A directory Open would refuse, or whose .metadata cannot be
// read, is left alone. No writer may be using the directory.
func RemoveStale(root *source.Dir) ([]string, error) {
	names, meta, err := loadCommitted(root)
	switch {
	case errors.Is(err, ErrUnsupported), errors.Is(err, ckpt.ErrInvalid):
		return nil, nil
	case err != nil:
		return nil, err
	}
	removed, err := removeUnreferenced(root, names, referencedFiles(meta))
	if len(removed) > 0 {
		if serr := root.Sync("."); err == nil && serr != nil {
			err = fmt.Errorf("dcpwrite: %w", serr)
		}
	}
	return removed, err
}

// Metadata is the committed state: what .metadata holds (empty before the
// first commit). It is never mutated.
func (d *Dir) Metadata() *torchdcp.Metadata {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.meta
}

// Path is the directory.
func (d *Dir) Path() string { return d.root.Path(".") }

// Committed returns the FQNs (Target.FQN of the written names) of every
// tensor in the committed .metadata, in its order, earlier content included.
func (d *Dir) Committed() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, it := range d.meta.Items {
		if it.Tensor != nil {
			out = append(out, it.FQN)
		}
	}
	return out
}

// planned is one tensor of a commit.
type planned struct {
	info   safetensors.TensorInfo
	fqn    string
	torch  string
	es     int64
	chunks []RankChunk
}

// reserve takes the number n of a commit's shard files __{rank}_{n}.distcp.
// Numbers are never shared: an eager commit reserves one while its file is
// still being written, and other commits go on meanwhile.
func (d *Dir) reserve() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.nextFile
	d.nextFile++
	return n
}

// release gives back the number n of a commit that failed and removed its
// files, if no number was reserved after it: a retry then reuses it.
func (d *Dir) release(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.nextFile == n+1 {
		d.nextFile = n
	}
}

// cleanup removes the shard files of a failed commit numbered n and returns
// err. A file that cannot be removed is left for Open, and its number is
// never used again.
func (d *Dir) cleanup(created []string, n int, err error) error {
	removed := true
	for _, name := range created {
		if rerr := d.root.Remove(name); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			removed = false
		}
	}
	if removed {
		d.release(n)
	}
	return err
}

// commitMeta rewrites .metadata to hold what is committed plus plan, whose
// chunks were written (fsynced) where infos says, into the files created,
// numbered n. Holding commitMu. On failure before the rename the files are
// removed and nothing is committed.
func (d *Dir) commitMeta(plan []planned, infos map[string]torchdcp.StorageInfo, created []string, n int) error {
	var (
		items   []torchdcp.Item
		planner []torchdcp.PlannerEntry
		storage []torchdcp.StorageEntry
	)
	for _, p := range plan {
		boxes := make([]torchdcp.ChunkMetadata, len(p.chunks))
		for i, c := range p.chunks {
			boxes[i] = torchdcp.ChunkMetadata{Offsets: c.Offsets, Sizes: c.Sizes}
		}
		items = append(items, torchdcp.Item{FQN: p.fqn, Tensor: &torchdcp.TensorMetadata{
			Properties: torchdcp.TensorProperties{DType: p.torch, Layout: "torch.strided"},
			Size:       clone(p.info.Shape), Chunks: boxes,
		}})
		planner = append(planner, torchdcp.PlannerEntry{Key: p.fqn, Path: d.target.plannerPath(p.info.Name)})
	}
	for _, p := range plan {
		for _, c := range p.chunks {
			idx := torchdcp.Index{FQN: p.fqn, Offset: c.Offsets}
			info, ok := infos[idx.Key()]
			if !ok {
				return d.cleanup(created, n, fmt.Errorf("dcpwrite: tensor %q chunk %v was not written", p.info.Name, c.Offsets))
			}
			storage = append(storage, torchdcp.StorageEntry{Index: idx, Info: info})
		}
	}
	meta := d.meta.With(items, planner, storage)
	if d.beforeMetadata != nil {
		if err := d.beforeMetadata(); err != nil {
			return d.cleanup(created, n, err)
		}
	}
	if err := d.writeMetadata(meta); err != nil {
		return d.cleanup(created, n, err)
	}
	// Committed: the rename happened.
	d.mu.Lock()
	d.meta = meta
	d.mu.Unlock()
	if err := d.root.Sync("."); err != nil {
		return fmt.Errorf("dcpwrite: committed, but fsync of %s failed: %w", d.Path(), err)
	}
	return nil
}

// plan checks the header against the committed state meta and places
// every tensor. It writes nothing.
func (d *Dir) plan(meta *torchdcp.Metadata, h *safetensors.Header) ([]planned, error) {
	seen := make(map[string]bool, len(meta.Items)+len(h.Tensors))
	for _, it := range meta.Items {
		seen[it.FQN] = true
	}
	plan := make([]planned, 0, len(h.Tensors))
	for _, ti := range h.Tensors {
		fqn := d.target.FQN(ti.Name)
		if seen[fqn] {
			return nil, fmt.Errorf("%w: %q", ErrExists, fqn)
		}
		seen[fqn] = true
		torch, es := ti.DType.Torch(), int64(ti.DType.Size())
		if torch == "" || es <= 0 || !torchdcp.Storable(torch) {
			return nil, fmt.Errorf("%w: tensor %q has dtype %s", ErrDType, ti.Name, ti.DType)
		}
		n, err := safetensors.ByteSize(ti.DType, ti.Shape)
		if err != nil {
			return nil, fmt.Errorf("dcpwrite: tensor %q: %w", ti.Name, err)
		}
		if n != ti.Size() {
			return nil, fmt.Errorf("dcpwrite: tensor %q: header gives %d bytes for %d expected", ti.Name, ti.Size(), n)
		}
		chunks := dedupEmpty(d.target.Chunks(ti.Name, ti.Shape))
		t := ckpt.Tensor{Name: fqn, DType: ti.DType, Shape: ti.Shape}
		for _, c := range chunks {
			if c.Rank < 0 {
				return nil, fmt.Errorf("dcpwrite: tensor %q: negative rank %d", ti.Name, c.Rank)
			}
			t.Chunks.Add(c.Offsets, c.Sizes, nil)
		}
		// torch's save-time checks: in bounds, no overlap, full coverage.
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("dcpwrite: %w", err)
		}
		plan = append(plan, planned{info: ti, fqn: fqn, torch: torch, es: es, chunks: chunks})
	}
	return plan, nil
}

// dedupEmpty drops chunks whose offsets repeat an earlier chunk's: torch
// keys chunks by (fqn, offsets), so equal empty boxes of several ranks are
// one chunk. (Equal non-empty boxes overlap and fail Validate.)
func dedupEmpty(cs []RankChunk) []RankChunk {
	seen := map[string]bool{}
	out := cs[:0:0]
	for _, c := range cs {
		k := torchdcp.Index{Offset: c.Offsets}.Key()
		n, _ := ckpt.NumElements(c.Sizes)
		if seen[k] && n == 0 {
			continue
		}
		seen[k] = true
		out = append(out, c)
	}
	return out
}

// writeMetadata replaces .metadata atomically: write .metadata.tmp, fsync,
// rename over .metadata.
func (d *Dir) writeMetadata(m *torchdcp.Metadata) error {
	tmp := torchdcp.MetadataTmp
	f, err := d.create(tmp, false)
	if err != nil {
		return fmt.Errorf("dcpwrite: %w", err)
	}
	err = torchdcp.EncodeMetadata(f, m)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = d.root.Rename(tmp, torchdcp.MetadataFile)
	}
	if err != nil {
		d.root.Remove(tmp)
		return fmt.Errorf("dcpwrite: writing .metadata: %w", err)
	}
	return nil
}

// createFile creates the file name in the directory, truncating it unless
// excl, where it must not exist.
func (d *Dir) createFile(name string, excl bool) (outFile, error) {
	flag := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if excl {
		flag = os.O_WRONLY | os.O_CREATE | os.O_EXCL
	}
	return d.root.OpenFile(name, flag, 0o644)
}

func readDirNames(root *source.Dir) ([]string, error) {
	ents, err := root.ReadDir(".")
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		if e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

func readLimited(root *source.Dir, name string, limit int64) ([]byte, error) {
	f, err := root.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", root.Path(name), limit)
	}
	return b, nil
}
