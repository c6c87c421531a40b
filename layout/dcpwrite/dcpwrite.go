// Package dcpwrite turns HuggingFace safetensors files into a PyTorch
// Distributed Checkpoint (DCP) that torch.distributed.checkpoint.load reads
// at any world size: the write path of ckptfs.
//
// A Dir is a DCP directory being written into. Each Commit reshards one
// complete safetensors file into new shard files, one per rank that holds a
// piece of it (__{rank}_{n}.distcp, n reserved for this commit and never
// used before), each a concatenation of torch.save zip archives, one per
// chunk. It then rewrites .metadata atomically to cover everything
// committed so far. .metadata is the only commit point: shard files it does
// not name are garbage from a failed or killed writer, and OpenDir (or
// RemoveStale) removes them. Dir.Eager does the same work while the file is
// still being written (eager.go), with the same bytes as a result.
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
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/ckptfs/ckptfs/layout/box"
	"github.com/ckptfs/ckptfs/layout/ckpt"
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

const (
	// outBufSize is the write buffer of a shard file.
	outBufSize = 1 << 20
	// maxMetadataBytes bounds the .metadata read by OpenDir.
	maxMetadataBytes = torchdcp.DefaultMaxMetadataBytes
)

// copyBufSize bounds the bytes of source read at once (a variable so tests
// can exercise run batching with small tensors).
var copyBufSize = 4 << 20

// rankWorkers is how many shard files a commit writes at once.
const rankWorkers = 4

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
	path   string
	target Target

	// Lock order: commitMu, then mu. commitMu serializes commits and is
	// held for their whole length (of an eager commit: its last step); mu
	// is held only to read or swap the committed state and to reserve file
	// numbers, so Committed and Eager never wait for a commit's I/O.
	commitMu sync.Mutex
	mu       sync.Mutex
	meta     *torchdcp.Metadata // written holding commitMu and mu, read holding either; never mutated
	nextFile int                // GUARDED_BY(mu): n of the next reserved shard files (reserve)

	// Test hooks.
	create         func(path string, excl bool) (outFile, error)
	beforeMetadata func() error
	syncDir        func(path string) error
	// removed lists the stale files OpenDir deleted (for tests).
	removed []string
}

// OpenDir opens the DCP directory path for writing, creating it (not its
// parents) if missing. An existing .metadata is the committed state: its
// entries are carried over into every later .metadata. Leftovers of an
// earlier writer that died mid-commit are removed: .metadata.tmp and every
// __{rank}_{n}.distcp that .metadata does not reference. A directory holding
// only torch's rank-local __{rank}.metadata files, or a .metadata with a
// root class other than Metadata (Megatron's MCoreMetadata) or custom
// planner_data, is refused (ErrUnsupported): rewriting it would drop data.
func OpenDir(path string, target Target) (*Dir, error) {
	d := &Dir{path: path, target: target, create: createFile, syncDir: ckpt.SyncDir}
	if err := os.Mkdir(path, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("dcpwrite: %w", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("dcpwrite: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("dcpwrite: %s is not a directory", path)
	}
	names, meta, err := loadCommitted(path)
	if err != nil {
		return nil, err
	}
	d.meta = meta
	referenced := referencedFiles(d.meta)
	if d.removed, err = removeUnreferenced(path, names, referenced); err != nil {
		return nil, err
	}
	// Commits number their files after every referenced one (present or not).
	for rel := range referenced {
		if _, k, ok := torchdcp.ParseShardName(rel); ok && k >= d.nextFile {
			d.nextFile = k + 1
		}
	}
	if len(d.removed) > 0 {
		if err := d.syncDir(path); err != nil {
			return nil, fmt.Errorf("dcpwrite: %w", err)
		}
	}
	return d, nil
}

// loadCommitted reads what the DCP directory path holds: the names of its
// regular files and its committed state, .metadata (empty when there is
// none). A checkpoint this writer cannot extend without losing data is
// refused (ErrUnsupported): torch's rank-local __{rank}.metadata files and
// no .metadata, a root class other than Metadata (Megatron's
// MCoreMetadata), or planner_data that is not the default planner's. A
// .metadata that cannot be decoded is an error wrapping ckpt.ErrInvalid.
func loadCommitted(path string) ([]string, *torchdcp.Metadata, error) {
	names, err := readDirNames(path)
	if err != nil {
		return nil, nil, fmt.Errorf("dcpwrite: %w", err)
	}
	b, err := readLimited(filepath.Join(path, torchdcp.MetadataFile), maxMetadataBytes)
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
func removeUnreferenced(path string, names []string, referenced map[string]bool) ([]string, error) {
	var removed []string
	for _, n := range names {
		if _, _, shard := torchdcp.ParseShardName(n); n == torchdcp.MetadataTmp || (shard && !referenced[n]) {
			if err := os.Remove(filepath.Join(path, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return removed, fmt.Errorf("dcpwrite: removing stale %s: %w", n, err)
			}
			removed = append(removed, n)
		}
	}
	return removed, nil
}

// RemoveStale removes what a writer killed mid-commit (or mid eager
// commit) left in the DCP directory path, as OpenDir does: .metadata.tmp
// and the shard files .metadata does not name. It returns the names
// removed. A directory OpenDir would refuse, or whose .metadata cannot be
// read, is left alone. No writer may be using the directory.
func RemoveStale(path string) ([]string, error) {
	names, meta, err := loadCommitted(path)
	switch {
	case errors.Is(err, ErrUnsupported), errors.Is(err, ckpt.ErrInvalid):
		return nil, nil
	case err != nil:
		return nil, err
	}
	removed, err := removeUnreferenced(path, names, referencedFiles(meta))
	if len(removed) > 0 {
		if serr := ckpt.SyncDir(path); err == nil && serr != nil {
			err = fmt.Errorf("dcpwrite: %w", serr)
		}
	}
	return removed, err
}

// Path is the directory.
func (d *Dir) Path() string { return d.path }

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

// Commit reshards one complete safetensors file into new shard files and
// rewrites .metadata to cover it and everything committed before. src holds
// the file and h is its validated header. Tensors are placed by the Target.
//
// Shard files are __{rank}_{n}.distcp with the same n, never used before,
// for every rank that gets a chunk; each is written, fsynced and closed
// before .metadata is replaced (write .metadata.tmp, fsync, rename, fsync
// the directory). Nothing is committed when Commit fails before the rename:
// a name already in the checkpoint (ErrExists), a dtype torch cannot hold
// (ErrDType), chunk boxes that do not tile a tensor, a short source, an I/O
// error or a full disk; the shard files it wrote are removed. A failure to
// fsync the directory after the rename is reported, but the commit stands.
//
// Memory is bounded by a copy buffer of 4 MiB and a 1 MiB write buffer, not
// by tensor size.
func (d *Dir) Commit(src io.ReaderAt, h *safetensors.Header) error {
	if h == nil {
		return errors.New("dcpwrite: nil header")
	}
	d.commitMu.Lock()
	defer d.commitMu.Unlock()

	plan, err := d.plan(d.meta, h) // d.meta only changes under commitMu
	if err != nil {
		return err
	}
	n := d.reserve()
	infos, created, err := d.writeShards(src, h, plan, n)
	if err != nil {
		return d.cleanup(created, n, err)
	}
	return d.commitMeta(plan, infos, created, n)
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
// err. A file that cannot be removed is left for OpenDir, and its number is
// never used again.
func (d *Dir) cleanup(created []string, n int, err error) error {
	removed := true
	for _, p := range created {
		if rerr := os.Remove(p); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			removed = false
		}
	}
	if removed {
		d.release(n)
	}
	return err
}

// writeShards writes the shard files numbered n of a planned commit from
// src, each fsynced and closed, and returns where every chunk went (by
// Index.Key) and the paths of the files it created (also on failure).
func (d *Dir) writeShards(src io.ReaderAt, h *safetensors.Header, plan []planned, n int) (map[string]torchdcp.StorageInfo, []string, error) {
	// Work per rank, in header (data) order, so each rank's file reads the
	// source front to back.
	type work struct {
		p *planned
		c RankChunk
	}
	byRank := map[int][]work{}
	for i := range plan {
		for _, c := range plan[i].chunks {
			byRank[c.Rank] = append(byRank[c.Rank], work{&plan[i], c})
		}
	}
	ranks := make([]int, 0, len(byRank))
	for r := range byRank {
		ranks = append(ranks, r)
	}
	sort.Ints(ranks)

	// Ranks are written in parallel by a few workers, each with its own
	// buffer: one rank's fsync overlaps the next rank's copy. The files are
	// named before any is written, so names do not depend on timing.
	files := make([]string, len(ranks))
	for i, r := range ranks {
		files[i] = torchdcp.ShardName(r, n)
	}
	var (
		mu      sync.Mutex
		created []string                            // GUARDED_BY(mu)
		infos   = map[string]torchdcp.StorageInfo{} // GUARDED_BY(mu)
		failed  error                               // GUARDED_BY(mu); first error
	)
	fail := func(err error) {
		mu.Lock()
		if failed == nil {
			failed = err
		}
		mu.Unlock()
	}
	stopped := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return failed != nil
	}
	writeRank := func(i int, buf []byte) error {
		rel := files[i]
		full := filepath.Join(d.path, rel)
		f, err := d.create(full, true)
		if err != nil {
			return fmt.Errorf("dcpwrite: %w", err)
		}
		mu.Lock()
		created = append(created, full)
		mu.Unlock()
		w := newShardWriter(f)
		for _, wk := range byRank[ranks[i]] {
			if stopped() {
				f.Close()
				return nil
			}
			start := w.Pos()
			if err := writeChunk(w, src, h.DataStart+wk.p.info.Begin, wk.p, wk.c, buf); err != nil {
				f.Close()
				return fmt.Errorf("dcpwrite: %s: tensor %q chunk %v: %w", rel, wk.p.info.Name, wk.c.Offsets, err)
			}
			mu.Lock()
			infos[torchdcp.Index{FQN: wk.p.fqn, Offset: wk.c.Offsets}.Key()] = torchdcp.StorageInfo{
				RelativePath: rel, Offset: start, Length: w.Pos() - start,
			}
			mu.Unlock()
		}
		if err := w.Flush(); err != nil {
			f.Close()
			return fmt.Errorf("dcpwrite: %s: %w", rel, err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("dcpwrite: %s: fsync: %w", rel, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("dcpwrite: %s: %w", rel, err)
		}
		return nil
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(rankWorkers, len(ranks)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, copyBufSize)
			for i := range next {
				if err := writeRank(i, buf); err != nil {
					fail(err)
				}
			}
		}()
	}
	for i := range ranks {
		if stopped() {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return infos, created, failed
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
	if err := d.syncDir(d.path); err != nil {
		return fmt.Errorf("dcpwrite: committed, but fsync of %s failed: %w", d.path, err)
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
			t.Chunks = append(t.Chunks, ckpt.Chunk{Offsets: c.Offsets, Sizes: c.Sizes})
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
	tmp := filepath.Join(d.path, torchdcp.MetadataTmp)
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
		err = os.Rename(tmp, filepath.Join(d.path, torchdcp.MetadataFile))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("dcpwrite: writing .metadata: %w", err)
	}
	return nil
}

func createFile(path string, excl bool) (outFile, error) {
	flag := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if excl {
		flag = os.O_WRONLY | os.O_CREATE | os.O_EXCL
	}
	return os.OpenFile(path, flag, 0o644)
}

func readDirNames(path string) ([]string, error) {
	ents, err := os.ReadDir(path)
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

func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, nil
}

// shardWriter buffers writes to a shard file and tracks the position.
type shardWriter struct {
	f   outFile
	bw  *bufio.Writer
	pos int64
}

func newShardWriter(f outFile) *shardWriter {
	return &shardWriter{f: f, bw: bufio.NewWriterSize(f, outBufSize)}
}

func (w *shardWriter) Write(p []byte) (int, error) {
	n, err := w.bw.Write(p)
	w.pos += int64(n)
	return n, err
}

func (w *shardWriter) Pos() int64 { return w.pos }

func (w *shardWriter) Flush() error { return w.bw.Flush() }

func (w *shardWriter) Patch(p []byte, off int64) error {
	if err := w.bw.Flush(); err != nil {
		return err
	}
	_, err := w.f.WriteAt(p, off)
	return err
}

// writeChunk writes one chunk of a tensor whose bytes start at base in src
// as a torch.save record.
func writeChunk(w torchdcp.PosWriter, src io.ReaderAt, base int64, p *planned, c RankChunk, buf []byte) error {
	rec, err := torchdcp.NewRecordWriter(w, p.torch, p.es, c.Sizes)
	if err != nil {
		return err
	}
	if err := copyBox(rec, src, base, p.info.Shape, c.Offsets, c.Sizes, p.es, buf); err != nil {
		return err
	}
	return rec.Close()
}

// copyBox writes the box (offsets, sizes) of a C-order tensor of the given
// shape and element size, stored at base in src, to w in C order. The box
// is a sequence of equal runs that are contiguous in the source (one run
// for a dim-0 box, one per row for a dim-1 box of a matrix); runs are
// gathered with one ReadAt per buffer-full of source span, never one per
// run.
func copyBox(w io.Writer, src io.ReaderAt, base int64, shape, offsets, sizes []int64, es int64, buf []byte) error {
	emit := func(b []byte) error {
		_, err := w.Write(b)
		return err
	}
	g, err := box.New(shape, es, box.Box{Offsets: offsets, Sizes: sizes})
	if err != nil || g.Bytes() == 0 {
		return err
	}
	runLen, runs, bufLen := g.RunLen(), g.Runs(), int64(len(buf))
	for r := int64(0); r < runs; {
		first := g.RunStart(r)
		if runLen > bufLen {
			if err := copyRange(src, base+first, runLen, buf, emit); err != nil {
				return err
			}
			r++
			continue
		}
		// Runs r..k-1: those whose span from first fits in buf.
		k := r + 1
		for k < runs && g.RunStart(k)+runLen-first <= bufLen {
			k++
		}
		if err := readFull(src, buf[:g.RunStart(k-1)+runLen-first], base+first); err != nil {
			return err
		}
		for i := r; i < k; i++ {
			at := g.RunStart(i) - first
			if err := emit(buf[at : at+runLen]); err != nil {
				return err
			}
		}
		r = k
	}
	return nil
}

// copyRange emits length bytes of src at off, a buffer at a time.
func copyRange(src io.ReaderAt, off, length int64, buf []byte, emit func([]byte) error) error {
	for length > 0 {
		m := min(length, int64(len(buf)))
		if err := readFull(src, buf[:m], off); err != nil {
			return err
		}
		if err := emit(buf[:m]); err != nil {
			return err
		}
		off += m
		length -= m
	}
	return nil
}

// errShortSource is returned when the source ends before a chunk's bytes.
var errShortSource = errors.New("dcpwrite: source shorter than its header says")

func readFull(src io.ReaderAt, p []byte, off int64) error {
	n, err := src.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		return fmt.Errorf("%w: read %d of %d bytes at %d", errShortSource, n, len(p), off)
	}
	return err
}
