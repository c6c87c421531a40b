// Package readpath moves a view file's bytes from its source to a FUSE
// reply: vfs opens a Reader per open and maps Read's error to an errno.
//
// The mode follows from the source, once per mount. A local source (with
// DirectReads, the default) is read straight into the reply buffer by
// view.File.ReadAt (its read plan: the window's source ranges merged per
// file and read with preadv). An object store, or --direct-reads=false,
// goes through the block cache (package cache: one fill per block for all
// readers, read-ahead, a failed fill fails again for a second); the reply is
// written from its blocks without a copy and ends at a FUSE INTERRUPT
// (EINTR) or its deadline (EIO). Freshness: vfs checks at open
// (view.File.CheckFresh), layout/ckpt once per file after each read's batch.
// Page cache: local shard pages read are dropped (layout/source/local.go),
// view pages are kept across opens (KEEP_CACHE), and prefill (prefill.go)
// streams a view file into them once a loader reaches its tensors.
//
// Policy: what a mount's bytes move with (the block cache's block size,
// workers and read-ahead, the size and memory of an object store's streamed
// requests, each read's deadline, the process's memory limit), and the
// blocks and workers of inspect and export, are picked in one place, For
// (policy.go), from a description of the source and the host (cores,
// memory); the command only parses its flags into a Source.
package readpath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ckptfs/ckptfs/cache"
)

// ErrReadDeadline is the error of a read that got no bytes from its source
// within Options.ReadDeadline.
var ErrReadDeadline = errors.New("readpath: no answer from the source within the read's deadline")

// Options configure the read path of a mount.
type Options struct {
	// Cache is the mount's block cache; required. Every open holds one of
	// its handles, so its open_handles counts the open view files in both
	// modes.
	Cache *cache.Cache
	// Local says the source is a local directory, whose view files
	// DirectReads reads straight into each reply instead of through Cache.
	// Any other source (an object store) is read through Cache: its reads
	// are slow and billed, so each block is fetched once for all readers.
	Local, DirectReads bool
	// ReadDeadline bounds each read served through Cache; 0: none.
	ReadDeadline time.Duration
	// Prefill streams view files into the kernel page cache (prefill.go).
	Prefill bool
	// MemAvailable is the memory prefill may use; nil: the kernel's
	// MemAvailable.
	MemAvailable func() (int64, bool)
	// Logger gets prefill's debug lines; nil: slog.Default().
	Logger *slog.Logger
}

// Path is the read path of one mount.
type Path struct {
	opts    Options
	direct  bool       // read straight from the source, not through Cache
	prefill *prefiller // nil unless Options.Prefill
}

// New returns the read path of a mount; Close stops its prefill.
func New(opts Options) *Path {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MemAvailable == nil {
		opts.MemAvailable = memAvailable
	}
	p := &Path{opts: opts, direct: opts.Local && opts.DirectReads}
	if opts.Prefill {
		p.prefill = newPrefiller(opts)
	}
	return p
}

// Direct reports whether view files are read straight from their source.
func (p *Path) Direct() bool { return p.direct }

// Prefilled is the number of bytes prefill stored in the page cache.
func (p *Path) Prefilled() int64 {
	if p.prefill == nil {
		return 0
	}
	return p.prefill.stored.Load()
}

// Close stops prefill once the files it has taken are done; no Reader may
// read after it.
func (p *Path) Close() {
	if p.prefill != nil {
		p.prefill.stop()
	}
}

// File is a view file to read. Its bytes must never change: the cache keeps
// them by ID, and the kernel keeps its pages across opens.
type File struct {
	Name string      // for logs
	ID   uint64      // the cache's id of the bytes, the same across opens
	Src  io.ReaderAt // the bytes
	Size int64
	// DataOffset is where the tensor data starts: a read past it is a
	// loader at the tensors, which offers the file to prefill.
	DataOffset int64
	// Page is the file's page cache in the kernel (its inode), for prefill.
	Page PageCache
	// Hold, if set, keeps Src readable for a prefill that runs after the
	// open is closed: ok is false when Src can no longer be read, and
	// release ends the hold.
	Hold func() (release func(), ok bool)
}

// PageCache stores bytes of one file in the kernel's page cache
// (FUSE_NOTIFY_STORE; go-fuse's fs.Inode has it).
type PageCache interface {
	WriteCache(off int64, data []byte) syscall.Errno
}

// Reader is one open of a view file.
type Reader struct {
	p *Path
	f File
	h *cache.Handle
}

// Open opens f for reading; the caller closes the Reader. A direct open
// holds a cache handle too, so that open_handles counts it (Options.Cache).
func (p *Path) Open(f File) *Reader {
	return &Reader{p: p, f: f, h: p.opts.Cache.Open(f.ID, f.Src, f.Size)}
}

// Close ends the open: its queued read-ahead is dropped.
func (r *Reader) Close() { r.h.Close() }

// Read reads up to len(dest) bytes at off, fewer at the end of the file. A
// failed read returns the source's error, context.Canceled once the request
// was interrupted, or an error wrapping ErrReadDeadline.
func (r *Reader) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, error) {
	// A read past the header is a loader at the tensors: stream the rest.
	if p := r.p.prefill; p != nil && off+int64(len(dest)) > max(r.f.DataOffset, prefillPiece) {
		p.offer(r.f)
	}
	if r.p.direct {
		// Straight from the shards into dest: the kernel keeps what it is
		// sent in the view's page cache, so a block cache in between only
		// adds its own memory, fresh for every new mount (BENCHMARKS.md,
		// "direct reads").
		n, err := r.f.Src.ReadAt(dest, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		return fuse.ReadResultData(dest[:n]), nil
	}
	// The reply is written from the cache's blocks (writev), not copied
	// into dest first: that copy showed in the CPU profile of a cold read
	// (BENCHMARKS.md). The read stops waiting for fills at a FUSE INTERRUPT
	// and at its deadline, whatever the fills do.
	if d := r.p.opts.ReadDeadline; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, d, fmt.Errorf("%w (%s)", ErrReadDeadline, d))
		defer cancel()
	}
	pinned, err := r.h.Slices(ctx, off, len(dest))
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return pinnedReply{pinned}, nil
}

// pinnedReply is a read reply written from the cache's blocks (writev, as
// fuse.ReadResultVector), which are released once go-fuse has written it.
type pinnedReply struct{ p *cache.Pinned }

func (r pinnedReply) Size() int { return r.p.Len() }

func (r pinnedReply) Done() { r.p.Release() }

// Slices makes go-fuse write the parts with writev instead of copying
// them into one buffer first.
func (r pinnedReply) Slices() ([][]byte, fuse.Status) { return r.p.Parts, fuse.OK }

func (r pinnedReply) Bytes(buf []byte) ([]byte, fuse.Status) {
	buf = buf[:0]
	for _, part := range r.p.Parts {
		buf = append(buf, part...)
	}
	return buf, fuse.OK
}
