package dcpwrite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/safetensors"
)

// The reshard pipeline: the one way a safetensors file becomes shard files.
// A Reshard writes each chunk to its rank's shard file as the source bytes
// it needs become final (Source.Wait, a buffer-full at a time), so a file
// can be resharded while it is still being written, and when it is
// complete only the tail, the fsyncs and .metadata are left. Commit at
// close is the same run over a complete source, whose bytes are all final.
// Shard files are written with O_DIRECT where possible (direct.go).
//
// Its shard files are numbered by a file number reserved when it starts.
// Until Reshard.Commit renames .metadata nothing of it is committed:
// Discard, a failure, or a killed process leave shard files that .metadata
// does not name, which Discard, the failure path, or the next Open or
// RemoveStale remove.

// Source is the safetensors file a Reshard reads.
type Source interface {
	io.ReaderAt
	// Wait blocks until the bytes of the source below end are final and
	// returns nil, or returns an error when the reshard must stop. Bytes
	// below an end that Wait accepted must never change afterwards; if they
	// may have, the caller discards the reshard.
	Wait(end int64) error
}

// complete is a Source whose every byte is final.
type complete struct{ io.ReaderAt }

func (complete) Wait(int64) error { return nil }

// ErrTooMany is returned by Dir.Reshard when the Dir's Limits allow no more
// reshards of files being written: the file is committed at close instead.
var ErrTooMany = errors.New("dcpwrite: too many files being resharded while written")

const (
	// maxGrowing is the default bound (NewLimits) on the reshards of files
	// still being written that run at once over the Dirs sharing a Limits,
	// and so on their buffers: growingWorkers * (copyBufSize + recBufSize)
	// each.
	maxGrowing = 8
	// growingWorkers write the shard files of a file being written: when it
	// is closed they finish its tail in parallel.
	growingWorkers = 2
	// completeWorkers write the shard files of a complete file (Commit).
	completeWorkers = 4
	// recBufSize is the record buffer of a worker: a chunk record smaller
	// than this is written with one write.
	recBufSize = 64 << 10
	// writebackBytes is how much a rank file grows before its writeback is
	// started (sync_file_range), so that the fsync at the end finds little
	// left to write.
	writebackBytes = 8 << 20
)

// copyBufSize is the copy buffer of a worker: small enough that the bytes
// stay in cache between the read, the CRC and the write (a variable so
// tests can exercise run batching with small tensors).
var copyBufSize = 1 << 20

// Limits bounds what the Dirs sharing it run at once: the reshards of files
// still being written (Dir.Reshard). Whoever opens many Dirs (a mount) makes
// one for them all, so that two owners in one process do not share a
// bound; a Dir opened without one has its own.
type Limits struct {
	growing chan struct{} // a slot per reshard of a file being written, until its Run ends
}

// NewLimits returns the default Limits: maxGrowing reshards of files being
// written at once.
func NewLimits() *Limits {
	return &Limits{growing: make(chan struct{}, maxGrowing)}
}

// Reshard is the resharding of one safetensors file into shard files. Use:
// Dir.Reshard (or Commit, which does it all), then Run once (it returns
// when every chunk is written and fsynced), then exactly one of Commit or
// Discard. Discard may also follow Dir.Reshard without Run. The methods
// must not be called concurrently.
type Reshard struct {
	d       *Dir
	src     Source
	h       *safetensors.Header
	plan    []planned
	ranks   []int // ranks with a chunk, ascending
	n       int   // reserved file number
	workers int
	slot    bool // holds one of d.limits.growing until Run ends

	created  []string                        // names of the files created
	infos    map[string]torchdcp.StorageInfo // by Index.Key
	ran      bool                            // Run returned nil
	finished bool                            // committed or discarded
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
// Memory is bounded by a copy, a record and a staging buffer per worker,
// not by tensor size.
func (d *Dir) Commit(src io.ReaderAt, h *safetensors.Header) error {
	r, err := d.start(complete{src}, h, completeWorkers, false)
	if err != nil {
		return err
	}
	if err := r.Run(); err != nil {
		r.Discard()
		return err
	}
	return r.Commit()
}

// Reshard starts resharding the safetensors file src, still being written,
// whose header is h (validated, but maybe not yet against the final size),
// placing its tensors as Commit would. It writes nothing and does not wait.
// It fails when Commit would fail on the header (a name already committed,
// a dtype torch cannot hold, bad boxes), and with ErrTooMany.
func (d *Dir) Reshard(src Source, h *safetensors.Header) (*Reshard, error) {
	return d.start(src, h, growingWorkers, true)
}

func (d *Dir) start(src Source, h *safetensors.Header, workers int, limited bool) (*Reshard, error) {
	if h == nil {
		return nil, errors.New("dcpwrite: nil header")
	}
	d.mu.Lock()
	meta := d.meta
	d.mu.Unlock()
	plan, err := d.plan(meta, h)
	if err != nil {
		return nil, err
	}
	if limited {
		select {
		case d.limits.growing <- struct{}{}:
		default:
			return nil, ErrTooMany
		}
	}
	seen := map[int]bool{}
	var ranks []int
	for _, p := range plan {
		for _, c := range p.chunks {
			if !seen[c.Rank] {
				seen[c.Rank] = true
				ranks = append(ranks, c.Rank)
			}
		}
	}
	sort.Ints(ranks)
	return &Reshard{
		d: d, src: src, h: h, plan: plan, ranks: ranks, n: d.reserve(), workers: workers, slot: limited,
		infos: map[string]torchdcp.StorageInfo{},
	}, nil
}

func (r *Reshard) releaseSlot() {
	if r.slot {
		r.slot = false
		<-r.d.limits.growing
	}
}

// rankOut is one shard file of a reshard.
type rankOut struct {
	f      outFile
	rel    string
	pos    int64 // bytes written
	synced int64 // bytes whose writeback was started
}

// writeback starts writing what was added to the file since the last call
// to disk, without waiting, once there is enough of it.
func (o *rankOut) writeback(force bool) {
	if o.pos-o.synced < writebackBytes && (!force || o.pos == o.synced) {
		return
	}
	if f, ok := o.f.(interface{ Fd() uintptr }); ok {
		// Best effort: the fsync at the end is what makes the data durable.
		_ = unix.SyncFileRange(int(f.Fd()), o.synced, o.pos-o.synced, unix.SYNC_FILE_RANGE_WRITE)
	}
	o.synced = o.pos
}

// finish fsyncs and closes the file.
func (o *rankOut) finish() error {
	err := o.f.Sync()
	if err != nil {
		err = fmt.Errorf("dcpwrite: %s: fsync: %w", o.rel, err)
	}
	if cerr := o.f.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("dcpwrite: %s: %w", o.rel, cerr)
	}
	o.f = nil
	return err
}

// Run writes every chunk, in data order, to its rank's shard file as the
// source holds its bytes (src.Wait), then fsyncs and closes the files. It
// returns the first error of Wait or of I/O; the caller then calls
// Discard. A few workers write (the first on the caller's goroutine), each
// the files of its own ranks, each with
// one copy buffer, one record buffer and one staging buffer whatever the
// number of ranks (a record is written with a few large writes), and each
// fsyncs its files when it has written them.
func (r *Reshard) Run() error {
	defer r.releaseSlot()
	if r.finished || r.ran || r.created != nil {
		return errors.New("dcpwrite: reshard run twice")
	}
	files := make([]*rankOut, len(r.ranks))
	defer func() {
		for _, o := range files {
			if o != nil && o.f != nil {
				o.f.Close()
			}
		}
	}()
	// The files are named and created before any is written, so names do
	// not depend on timing.
	for i, rank := range r.ranks {
		rel := torchdcp.ShardName(rank, r.n)
		f, err := r.d.create(rel, true)
		if err != nil {
			return fmt.Errorf("dcpwrite: %w", err)
		}
		r.created = append(r.created, rel)
		if osf, ok := f.(*os.File); ok {
			f = directOut(osf)
		}
		files[i] = &rankOut{f: f, rel: rel}
	}
	nw := min(r.workers, len(r.ranks))
	infos := make([]map[string]torchdcp.StorageInfo, nw)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g, ctx := errgroup.WithContext(ctx)
	var first func() error
	for wi := range nw {
		// Worker wi writes the files of ranks[wi], ranks[wi+nw], ...
		mine := map[int]*rankOut{}
		for i := wi; i < len(r.ranks); i += nw {
			mine[r.ranks[i]] = files[i]
		}
		shareStaging(mine)
		infos[wi] = map[string]torchdcp.StorageInfo{}
		work := func() error { return r.work(ctx, mine, infos[wi]) }
		if wi == 0 {
			first = work // on the caller's goroutine, once the others started
			continue
		}
		g.Go(work)
	}
	var err error
	if first != nil { // nil when no rank gets a chunk
		if err = first(); err != nil {
			cancel() // the other workers stop at their next chunk
		}
	}
	// The error that stopped the others, not their stopping.
	if werr := g.Wait(); werr != nil && (err == nil || errors.Is(err, context.Canceled)) {
		err = werr
	}
	if err != nil {
		return err
	}
	for _, m := range infos {
		maps.Copy(r.infos, m)
	}
	r.ran = true
	return nil
}

// work writes the chunks of the ranks of files, in data order, recording
// where each went in infos, then fsyncs and closes the files.
func (r *Reshard) work(ctx context.Context, files map[int]*rankOut, infos map[string]torchdcp.StorageInfo) error {
	buf := make([]byte, copyBufSize)
	w := &recWriter{buf: make([]byte, 0, recBufSize)}
	for i := range r.plan {
		p := &r.plan[i]
		base := r.h.DataStart + p.info.Begin
		for _, c := range p.chunks {
			o := files[c.Rank]
			if o == nil {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err // another worker failed
			}
			w.reset(o.f, o.pos)
			err := writeChunk(w, r.src, base, p, c, buf)
			if err == nil {
				err = w.Flush()
			}
			if err != nil {
				return fmt.Errorf("dcpwrite: %s: tensor %q chunk %v: %w", o.rel, p.info.Name, c.Offsets, err)
			}
			infos[torchdcp.Index{FQN: p.fqn, Offset: c.Offsets}.Key()] = torchdcp.StorageInfo{
				RelativePath: o.rel, Offset: o.pos, Length: w.Pos() - o.pos,
			}
			o.pos = w.Pos()
			o.writeback(false)
		}
	}
	// Start the writeback of every file's tail, then wait for each.
	for _, o := range files {
		o.writeback(true)
	}
	for _, rank := range slices.Sorted(maps.Keys(files)) {
		if err := files[rank].finish(); err != nil {
			return err
		}
	}
	return nil
}

// Matches reports whether h is the header the reshard was started with: the
// strict header of the complete file must be, or the reshard is discarded.
func (r *Reshard) Matches(h *safetensors.Header) bool {
	if h == nil || h.DataStart != r.h.DataStart || !maps.Equal(h.Metadata, r.h.Metadata) ||
		len(h.Tensors) != len(r.h.Tensors) {
		return false
	}
	for i, t := range h.Tensors {
		u := r.h.Tensors[i]
		if t.Name != u.Name || t.DType != u.DType || !slices.Equal(t.Shape, u.Shape) || t.Begin != u.Begin || t.End != u.End {
			return false
		}
	}
	return true
}

// Commit makes the reshard part of the checkpoint, once Run returned nil
// and the source is complete: it rewrites .metadata (Dir.Commit says how).
// On failure (a tensor name committed meanwhile, an I/O error) nothing is
// committed and the shard files are removed.
func (r *Reshard) Commit() error {
	if r.finished {
		return errors.New("dcpwrite: reshard already finished")
	}
	if !r.ran {
		r.Discard()
		return errors.New("dcpwrite: reshard did not run to the end")
	}
	r.finished = true
	d := r.d
	d.commitMu.Lock()
	defer d.commitMu.Unlock()
	// Placement depends only on the header and the Target; what is
	// committed may have changed since the reshard started.
	if _, err := d.plan(d.meta, r.h); err != nil {
		return d.cleanup(r.created, r.n, err)
	}
	return d.commitMeta(r.plan, r.infos, r.created, r.n)
}

// Discard drops the reshard: its shard files are removed and its file
// number given back when possible. It does nothing after Commit.
func (r *Reshard) Discard() {
	r.releaseSlot()
	if r.finished {
		return
	}
	r.finished = true
	r.d.cleanup(r.created, r.n, nil)
}

// recWriter writes the record of one chunk to a shard file through a
// buffer that is flushed at the end of the chunk, so one buffer serves
// every rank. Writes of at least a buffer go straight to the file.
type recWriter struct {
	f    outFile
	base int64 // file position of buf[0]
	buf  []byte
}

var _ torchdcp.PosWriter = (*recWriter)(nil)

func (w *recWriter) reset(f outFile, pos int64) {
	w.f, w.base, w.buf = f, pos, w.buf[:0]
}

func (w *recWriter) Pos() int64 { return w.base + int64(len(w.buf)) }

func (w *recWriter) Write(p []byte) (int, error) {
	if len(w.buf)+len(p) > cap(w.buf) {
		if err := w.Flush(); err != nil {
			return 0, err
		}
		if len(p) >= cap(w.buf) {
			n, err := w.f.Write(p)
			w.base += int64(n)
			if err == nil && n < len(p) {
				err = io.ErrShortWrite
			}
			return n, err
		}
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

func (w *recWriter) Flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	n, err := w.f.Write(w.buf)
	w.base += int64(n)
	if err == nil && n < len(w.buf) {
		err = io.ErrShortWrite
	}
	w.buf = w.buf[:0]
	return err
}

func (w *recWriter) Patch(p []byte, off int64) error {
	if off >= w.base && off+int64(len(p)) <= w.Pos() {
		copy(w.buf[off-w.base:], p)
		return nil
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err := w.f.WriteAt(p, off)
	return err
}
