package readpath

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/procfs"

	"github.com/ckptfs/ckptfs/cache"
)

// A loader (safetensors, transformers) maps a view file and faults its pages
// in the order tensors are touched: small scattered reads that a FUSE file
// serves far slower than a disk streams. The prefiller instead reads a view
// file front to back through the block cache, as soon as a loader starts on
// its tensor data, and stores each piece in the kernel's page cache
// (FUSE_NOTIFY_STORE), so the faults find their pages there. One file at a
// time, in the order loaders reach them, and only while memory allows: the
// pages are ordinary clean page cache that the kernel evicts under
// pressure, and a file too large for the memory available is left to the
// faults.

// prefillPiece is the size of each store into the page cache.
const prefillPiece = 1 << 20

// minAvailable is the memory (MemAvailable) below which prefilling stops.
const minAvailable = 512 << 20

type prefiller struct {
	cache        *cache.Cache
	log          *slog.Logger
	memAvailable func() (int64, bool)
	queue        chan prefillJob

	mu      sync.Mutex
	offered map[uint64]bool // GUARDED_BY(mu); cache ids queued or done
	stopped bool            // GUARDED_BY(mu); the queue is closed

	// stored counts the bytes the kernel took into its page cache
	// (Path.Prefilled). What it keeps is up to the kernel: reclaim
	// (DAMON's pageout on some VMs included) may drop clean pages any time.
	stored atomic.Int64
}

// prefillJob is a view file to fill. It holds its File's Hold until filled
// or dropped, so its source stays readable.
type prefillJob struct {
	f       File
	release func()
}

func newPrefiller(opts Options) *prefiller {
	p := &prefiller{cache: opts.Cache, log: opts.Logger, memAvailable: opts.MemAvailable,
		queue: make(chan prefillJob, 64), offered: map[uint64]bool{}}
	go p.run()
	return p
}

// offer queues a view file, once per mount (its cache id is the same
// across re-opens of its view).
func (p *prefiller) offer(f File) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.offered[f.ID] || p.stopped {
		return
	}
	job := prefillJob{f: f, release: func() {}}
	if f.Hold != nil {
		var ok bool
		if job.release, ok = f.Hold(); !ok {
			return // the caller's open holds the source: not reached
		}
	}
	p.offered[f.ID] = true
	select {
	case p.queue <- job:
	default: // a long queue: loaders are ahead of the disk anyway
		job.release()
	}
}

// stop ends the queue; later offers are ignored (a read racing the
// unmount).
func (p *prefiller) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopped {
		p.stopped = true
		close(p.queue)
	}
}

func (p *prefiller) run() {
	for job := range p.queue {
		p.fill(job.f)
		job.release()
	}
}

// fill streams one file into the page cache, straight from the cache's
// blocks.
func (p *prefiller) fill(f File) {
	log := p.log.With("file", f.Name)
	if avail, ok := p.memAvailable(); !ok || avail < minAvailable+2*f.Size {
		log.Debug("not prefilling: not enough memory available", "size", f.Size, "available", avail)
		return
	}
	h := p.cache.Open(f.ID, f.Src, f.Size)
	defer h.Close()
	nextCheck := int64(64 << 20) // memory is checked again every 64 MiB
	for off := int64(0); off < f.Size; {
		pinned, err := h.Slices(context.Background(), off, prefillPiece)
		if err != nil && !errors.Is(err, io.EOF) {
			log.Debug("prefill stopped", "err", err)
			return
		}
		if len(pinned.Parts) == 0 {
			return
		}
		errno := syscall.Errno(0)
		for _, part := range pinned.Parts {
			if errno = f.Page.WriteCache(off, part); errno != 0 {
				break
			}
			off += int64(len(part))
			p.stored.Add(int64(len(part)))
		}
		pinned.Release()
		if errno != 0 {
			log.Debug("prefill stopped: kernel refused the pages", "errno", errno)
			return
		}
		if off >= nextCheck {
			nextCheck += 64 << 20
			if avail, ok := p.memAvailable(); !ok || avail < minAvailable {
				log.Debug("prefill stopped: memory is short", "at", off)
				return
			}
		}
	}
}

// memAvailable is the kernel's MemAvailable, in bytes.
func memAvailable() (int64, bool) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, false
	}
	mi, err := fs.Meminfo()
	if err != nil || mi.MemAvailableBytes == nil {
		return 0, false
	}
	return int64(*mi.MemAvailableBytes), true
}
