package dcpwrite

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/layout/box"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/safetensors"
)

// An eager commit reshards a safetensors file while it is still being
// written: the header is known, and each chunk is written to its rank's
// shard file as soon as the source bytes it needs are final, so that when
// the file is complete only the tail, the fsyncs and .metadata are left.
//
// Its shard files are the ones Commit would write for the same source, byte
// for byte (same records, in the same order, same .metadata), under a file
// number reserved when the attempt starts. Until Eager.Commit renames
// .metadata nothing of it is committed: Discard, a failure, or a killed
// process leave shard files that .metadata does not name, which Discard,
// Commit's failure path, or the next OpenDir or RemoveStale remove.

// Growing is the source of an eager commit: a file still being written.
type Growing interface {
	io.ReaderAt
	// Wait blocks until the bytes of the source below end are final and
	// returns nil, or returns an error when the attempt must stop. Bytes
	// below an end that Wait accepted must never change afterwards; if they
	// may have, the caller discards the attempt.
	Wait(end int64) error
}

// ErrBusy is returned by Dir.Eager when maxEager eager commits are under
// way in the process: the file is committed by Commit instead.
var ErrBusy = errors.New("dcpwrite: too many eager commits under way")

const (
	// maxEager bounds the eager commits running at once in the process, and
	// so their buffers: eagerWorkers * (eagerCopyBufSize + recBufSize) each.
	maxEager = 8
	// eagerWorkers is how many goroutines write the shard files of an eager
	// commit: when the file is closed they finish its tail in parallel.
	eagerWorkers = 2
	// eagerCopyBufSize is the copy buffer of a worker: small enough that
	// the bytes stay in cache between the read, the CRC and the write.
	eagerCopyBufSize = 1 << 20
	// recBufSize is the record buffer of a worker: a chunk record smaller
	// than this is written with one write.
	recBufSize = 64 << 10
	// writebackBytes is how much a rank file grows before its writeback is
	// started (sync_file_range), so that the fsync at the end finds little
	// left to write.
	writebackBytes = 8 << 20
)

var eagerSlots = make(chan struct{}, maxEager)

// Eager is an eager commit of one safetensors file. Use: Dir.Eager, then
// Run once (it returns when every chunk is written and fsynced), then
// exactly one of Commit or Discard. Discard may also follow Eager without
// Run. The methods must not be called concurrently.
type Eager struct {
	d     *Dir
	src   Growing
	h     *safetensors.Header
	plan  []planned
	ranks []int // ranks with a chunk, ascending
	n     int   // reserved file number

	slot     sync.Once
	created  []string                        // paths of the files created
	infos    map[string]torchdcp.StorageInfo // by Index.Key
	ran      bool                            // Run returned nil
	finished bool                            // committed or discarded
}

// Eager starts an eager commit of the safetensors file src whose header is
// h (validated, but maybe not yet against the final size), placing its
// tensors as Commit would. It writes nothing and does not wait. It fails
// when Commit would fail on the header (a name already committed, a dtype
// torch cannot hold, bad boxes), and with ErrBusy.
func (d *Dir) Eager(src Growing, h *safetensors.Header) (*Eager, error) {
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
	select {
	case eagerSlots <- struct{}{}:
	default:
		return nil, ErrBusy
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
	return &Eager{
		d: d, src: src, h: h, plan: plan, ranks: ranks, n: d.reserve(),
		infos: map[string]torchdcp.StorageInfo{},
	}, nil
}

func (e *Eager) releaseSlot() { e.slot.Do(func() { <-eagerSlots }) }

// rankOut is one shard file of an eager commit.
type rankOut struct {
	f      outFile
	rel    string
	pos    int64 // bytes written
	synced int64 // bytes whose writeback was started
}

// writeback starts writing what was added to the file since the last call
// to disk, without waiting, once there is enough of it.
func (r *rankOut) writeback(force bool) {
	if r.pos-r.synced < writebackBytes && (!force || r.pos == r.synced) {
		return
	}
	if f, ok := r.f.(interface{ Fd() uintptr }); ok {
		// Best effort: the fsync at the end is what makes the data durable.
		_ = unix.SyncFileRange(int(f.Fd()), r.synced, r.pos-r.synced, unix.SYNC_FILE_RANGE_WRITE)
	}
	r.synced = r.pos
}

// Run writes every chunk, in data order, to its rank's shard file as soon
// as the source holds its bytes (src.Wait), then fsyncs and closes the
// files. It returns the first error of Wait or of I/O; the caller then
// calls Discard. A few workers write, each the files of its own ranks,
// each with one copy buffer and one record buffer whatever the number of
// ranks: a record is written with a few large writes.
func (e *Eager) Run() error {
	defer e.releaseSlot()
	if e.finished || e.ran || e.created != nil {
		return errors.New("dcpwrite: eager commit run twice")
	}
	files := make([]*rankOut, len(e.ranks))
	defer func() {
		for _, rf := range files {
			if rf != nil && rf.f != nil {
				rf.f.Close()
			}
		}
	}()
	for i, r := range e.ranks {
		rel := torchdcp.ShardName(r, e.n)
		full := filepath.Join(e.d.path, rel)
		f, err := e.d.create(full, true)
		if err != nil {
			return fmt.Errorf("dcpwrite: %w", err)
		}
		e.created = append(e.created, full)
		files[i] = &rankOut{f: f, rel: rel}
	}
	nw := min(eagerWorkers, len(e.ranks))
	var (
		stop  atomic.Bool
		wg    sync.WaitGroup
		errs  = make([]error, nw)
		infos = make([]map[string]torchdcp.StorageInfo, nw)
	)
	for wi := range nw {
		// Worker wi writes the files of ranks[wi], ranks[wi+nw], ...
		mine := map[int]*rankOut{}
		for i := wi; i < len(e.ranks); i += nw {
			mine[e.ranks[i]] = files[i]
		}
		infos[wi] = map[string]torchdcp.StorageInfo{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[wi] = e.work(mine, infos[wi], &stop); errs[wi] != nil {
				stop.Store(true)
			}
		}()
	}
	wg.Wait()
	for wi := range nw {
		if errs[wi] != nil && !errors.Is(errs[wi], errStopped) {
			return errs[wi]
		}
	}
	for _, m := range infos {
		maps.Copy(e.infos, m)
	}
	// Start the writeback of every file's tail, then fsync a few at once.
	for _, rf := range files {
		rf.writeback(true)
	}
	ferrs := make([]error, len(files))
	sem := make(chan struct{}, rankWorkers)
	for i, rf := range files {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := rf.f.Sync(); err != nil {
				ferrs[i] = fmt.Errorf("dcpwrite: %s: fsync: %w", rf.rel, err)
			}
		}()
	}
	wg.Wait()
	for i, rf := range files {
		if err := rf.f.Close(); err != nil && ferrs[i] == nil {
			ferrs[i] = fmt.Errorf("dcpwrite: %s: %w", rf.rel, err)
		}
		rf.f = nil
	}
	if err := errors.Join(ferrs...); err != nil {
		return err
	}
	e.ran = true
	return nil
}

// errStopped ends a worker of Run when another failed.
var errStopped = errors.New("dcpwrite: eager commit stopped")

// work writes the chunks of the ranks of files, in data order, recording
// where each went in infos.
func (e *Eager) work(files map[int]*rankOut, infos map[string]torchdcp.StorageInfo, stop *atomic.Bool) error {
	buf := make([]byte, min(copyBufSize, eagerCopyBufSize))
	w := &recWriter{buf: make([]byte, 0, recBufSize)}
	for i := range e.plan {
		p := &e.plan[i]
		base := e.h.DataStart + p.info.Begin
		for _, c := range p.chunks {
			rf := files[c.Rank]
			if rf == nil {
				continue
			}
			if stop.Load() {
				return errStopped
			}
			g, err := box.New(p.info.Shape, p.es, box.Box{Offsets: c.Offsets, Sizes: c.Sizes})
			if err != nil {
				return err
			}
			if err := e.src.Wait(base + g.End()); err != nil {
				return err
			}
			w.reset(rf.f, rf.pos)
			err = writeChunk(w, e.src, base, p, c, buf)
			if err == nil {
				err = w.Flush()
			}
			if err != nil {
				return fmt.Errorf("dcpwrite: %s: tensor %q chunk %v: %w", rf.rel, p.info.Name, c.Offsets, err)
			}
			infos[torchdcp.Index{FQN: p.fqn, Offset: c.Offsets}.Key()] = torchdcp.StorageInfo{
				RelativePath: rf.rel, Offset: rf.pos, Length: w.Pos() - rf.pos,
			}
			rf.pos = w.Pos()
			rf.writeback(false)
		}
	}
	return nil
}

// Matches reports whether h is the header the eager commit was started
// with: the strict header of the complete file must be, or the attempt is
// discarded.
func (e *Eager) Matches(h *safetensors.Header) bool {
	if h == nil || h.DataStart != e.h.DataStart || !maps.Equal(h.Metadata, e.h.Metadata) ||
		len(h.Tensors) != len(e.h.Tensors) {
		return false
	}
	for i, t := range h.Tensors {
		u := e.h.Tensors[i]
		if t.Name != u.Name || t.DType != u.DType || !slices.Equal(t.Shape, u.Shape) || t.Begin != u.Begin || t.End != u.End {
			return false
		}
	}
	return true
}

// Commit makes the eager commit part of the checkpoint, once Run returned
// nil and the source is complete: it rewrites .metadata as Commit does.
// On failure (a tensor name committed meanwhile, an I/O error) nothing is
// committed and the shard files are removed.
func (e *Eager) Commit() error {
	if e.finished {
		return errors.New("dcpwrite: eager commit already finished")
	}
	if !e.ran {
		e.Discard()
		return errors.New("dcpwrite: eager commit did not run to the end")
	}
	e.finished = true
	d := e.d
	d.commitMu.Lock()
	defer d.commitMu.Unlock()
	// Placement depends only on the header and the Target; what is
	// committed may have changed since Eager.
	if _, err := d.plan(d.meta, e.h); err != nil {
		return d.cleanup(e.created, e.n, err)
	}
	return d.commitMeta(e.plan, e.infos, e.created, e.n)
}

// Discard drops the eager commit: its shard files are removed and its file
// number given back when possible. It does nothing after Commit.
func (e *Eager) Discard() {
	e.releaseSlot()
	if e.finished {
		return
	}
	e.finished = true
	e.d.cleanup(e.created, e.n, nil)
}

// recWriter writes the record of one chunk to a shard file through a
// buffer that is flushed at the end of the chunk, so one buffer serves
// every rank. Writes of at least a buffer go straight to the file.
type recWriter struct {
	f    outFile
	base int64 // file position of buf[0]
	buf  []byte
}

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
