package vfs

import (
	"bufio"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/ckptfs/ckptfs/layout"
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

type prefillJob struct {
	node *fs.Inode
	file *layout.File
	id   uint64
}

func newPrefiller(fsys *FS) *prefiller {
	p := &prefiller{fsys: fsys, queue: make(chan prefillJob, 64), offered: map[uint64]bool{}}
	go p.run()
	return p
}

// offer queues a view file, once per mount.
func (p *prefiller) offer(node *fs.Inode, file *layout.File, id uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.offered[id] {
		return
	}
	p.offered[id] = true
	select {
	case p.queue <- prefillJob{node, file, id}:
	default: // a long queue: loaders are ahead of the disk anyway
	}
}

func (p *prefiller) stop() { close(p.queue) }

func (p *prefiller) run() {
	for job := range p.queue {
		p.fill(job)
	}
}

// fill streams one file into the page cache, straight from the cache's
// blocks.
func (p *prefiller) fill(job prefillJob) {
	log := p.fsys.log.With("file", job.file.Name)
	if avail, ok := memAvailable(); !ok || avail < minAvailable+2*job.file.Size {
		log.Debug("not prefilling: not enough memory available", "size", job.file.Size, "available", avail)
		return
	}
	h := p.fsys.opts.Cache.Open(job.id, job.file, job.file.Size)
	defer h.Close()
	nextCheck := int64(64 << 20) // memory is checked again every 64 MiB
	for off := int64(0); off < job.file.Size; {
		pinned, err := h.Slices(off, prefillPiece)
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

// memAvailable reads MemAvailable from /proc/meminfo, in bytes.
func memAvailable() (int64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}
