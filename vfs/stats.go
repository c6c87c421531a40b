package vfs

import (
	"context"
	"encoding/json"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ckptfs/ckptfs/cache"
	"github.com/ckptfs/ckptfs/layout/source"
)

// statsFile is .ckptfs: a JSON snapshot of the mount's counters, taken at
// open. It is direct-io so its size can change between opens.
type statsFile struct {
	fs.Inode
	fsys *FS
}

var (
	_ = (fs.NodeGetattrer)((*statsFile)(nil))
	_ = (fs.NodeOpener)((*statsFile)(nil))
	_ = (fs.NodeReader)((*statsFile)(nil))
)

// Stats is the content of the .ckptfs file.
type Stats struct {
	Source      string `json:"source"`
	BytesServed int64  `json:"bytes_served"`
	// PassBytesServed counts the bytes of files shown as they are that
	// ckptfs read itself: with FUSE passthrough the kernel reads them and
	// this stays 0.
	PassBytesServed int64 `json:"pass_bytes_served"`
	// PrefilledBytes counts the bytes --prefill stored in the kernel's page
	// cache (which may drop them again under memory pressure).
	PrefilledBytes int64 `json:"prefilled_bytes"`
	ReadErrors     int64 `json:"read_errors"`
	// LookupErrors counts the lookups, attributes and listings answered EIO
	// (or EACCES) because the source failed; a name not there is no error.
	LookupErrors int64 `json:"lookup_errors"`
	// Commits and CommitErrors count the files closed in write targets.
	Commits      int64       `json:"commits,omitempty"`
	CommitErrors int64       `json:"commit_errors,omitempty"`
	Cache        cache.Stats `json:"cache"`
	// SourceIO is the traffic of a remote source (requests, bytes fetched,
	// retries, errors, disk cache); absent for a local one.
	SourceIO *source.Stats `json:"source_io,omitempty"`
	// MetadataBytes is the resident metadata of the open views, within
	// MetadataBudget (the newest view may pass it by its own size).
	MetadataBytes  int64       `json:"metadata_bytes"`
	MetadataBudget int64       `json:"metadata_budget"`
	Views          []ViewStats `json:"views"`
}

// ViewStats describes one opened checkpoint view.
type ViewStats struct {
	Dir     string `json:"dir"`
	Format  string `json:"format,omitempty"`
	Files   int    `json:"files"`
	Tensors int    `json:"tensors"`
	Bytes   int64  `json:"bytes"`
	Error   string `json:"error,omitempty"`
	// Writing marks a write target of this mount (its view so far).
	Writing bool `json:"writing,omitempty"`
	// MetadataBytes is the view's resident metadata while it is open
	// (View.ResidentBytes), 0 when it is closed.
	MetadataBytes int64 `json:"metadata_bytes,omitempty"`
}

// Stats returns a snapshot of the mount's counters.
func (f *FS) Stats() Stats {
	s := Stats{Source: f.root, BytesServed: f.bytesServed.Load(), PassBytesServed: f.passServed.Load(), ReadErrors: f.readErrors.Load(), LookupErrors: f.lookupErrors.Load(), Cache: f.opts.Cache.Stats(),
		Commits: f.commits.Load(), CommitErrors: f.commitErrors.Load()}
	s.PrefilledBytes = f.reads.Prefilled()
	if c, ok := f.opts.Tree.(source.Counted); ok {
		st := c.Stats()
		s.SourceIO = &st
	}
	f.mu.Lock()
	targets := make([]*target, 0, len(f.targets))
	for _, t := range f.targets {
		targets = append(targets, t)
	}
	f.mu.Unlock()
	for _, t := range targets {
		s.Views = append(s.Views, t.stats())
	}
	vs := f.views.Stats()
	s.MetadataBytes, s.MetadataBudget = vs.MetadataBytes, vs.Limits.Meta
	for _, e := range vs.Entries {
		v := ViewStats{Dir: e.Dir, Format: e.Format, Files: e.Files, Tensors: e.Tensors, Bytes: e.Bytes, MetadataBytes: e.MetadataBytes}
		if e.Err != nil {
			v.Error = e.Err.Error()
		}
		s.Views = append(s.Views, v)
	}
	return s
}

func (f *statsFile) snapshot() []byte {
	b, _ := json.MarshalIndent(f.fsys.Stats(), "", "  ")
	return append(b, '\n')
}

func (f *statsFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	setAttr(&out.Attr, time.Now(), int64(len(f.snapshot())), syscall.S_IFREG)
	showAccess(&out.Attr, f.fsys.statsAccess())
	out.SetTimeout(0)
	return 0
}

func (f *statsFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return nil, 0, syscall.EROFS
	}
	return &memHandle{data: f.snapshot()}, fuse.FOPEN_DIRECT_IO, 0
}

func (f *statsFile) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if h, ok := fh.(*memHandle); ok {
		return fuse.ReadResultData(sliceAt(h.data, dest, off)), 0
	}
	return fuse.ReadResultData(sliceAt(f.snapshot(), dest, off)), 0
}

type memHandle struct{ data []byte }
