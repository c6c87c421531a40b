package vfs

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/prometheus/procfs"
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
	fsys  *FS
	queue chan prefillJob

	mu      sync.Mutex
	offered map[uint64]bool // GUARDED_BY(mu); cache ids queued or done

	// stored counts the bytes the kernel took into its page cache
	// (Stats.PrefilledBytes). What it keeps is up to the kernel: reclaim
	// (DAMON's pageout on some VMs included) may drop clean pages any time.
	stored atomic.Int64
}

// prefillJob is a view file to fill. It holds a reference to a
// checkpoint's view until filled or dropped, so its files stay open.
type prefillJob struct {
	node *fs.Inode
	src  *viewReader
	size int64
	id   uint64
}

// done drops the job's reference.
func (j prefillJob) done(fsys *FS) {
	if j.src.inst != nil {
		fsys.unref(j.src.inst)
	}
}

func newPrefiller(fsys *FS) *prefiller {
	p := &prefiller{fsys: fsys, queue: make(chan prefillJob, 64), offered: map[uint64]bool{}}
	go p.run()
	return p
}

// offer queues a view file, once per mount (its cache id is the same
// across re-opens of its view).
func (p *prefiller) offer(node *fs.Inode, src *viewReader, size int64, id uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.offered[id] {
		return
	}
	if src.inst != nil && !src.inst.ref() {
		return // the caller's handle holds one: not reached
	}
	p.offered[id] = true
	job := prefillJob{node, src, size, id}
	select {
	case p.queue <- job:
	default: // a long queue: loaders are ahead of the disk anyway
		job.done(p.fsys)
	}
}

func (p *prefiller) stop() { close(p.queue) }

func (p *prefiller) run() {
	for job := range p.queue {
		p.fill(job)
		job.done(p.fsys)
	}
}

// fill streams one file into the page cache, straight from the cache's
// blocks.
func (p *prefiller) fill(job prefillJob) {
	log := p.fsys.log.With("file", job.src.file.Name)
	if avail, ok := memAvailable(); !ok || avail < minAvailable+2*job.size {
		log.Debug("not prefilling: not enough memory available", "size", job.size, "available", avail)
		return
	}
	h := p.fsys.opts.Cache.Open(job.id, job.src, job.size)
	defer h.Close()
	nextCheck := int64(64 << 20) // memory is checked again every 64 MiB
	for off := int64(0); off < job.size; {
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
			if errno = job.node.WriteCache(off, part); errno != 0 {
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
			if avail, ok := memAvailable(); !ok || avail < minAvailable {
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
