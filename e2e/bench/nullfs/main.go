// Command nullfs is the FUSE transport's own ceiling for the benchmarks: a
// go-fuse server with one read-only file of a given size whose every read
// returns a static buffer (no source, no copy), mounted with go-fuse's
// default options unless flags say otherwise. With -attr-timeout, a cold
// read of it is the fastest any go-fuse server can serve a file of that size
// here; without, its attributes are never cached, and the kernel asks
// GETATTR before every read(2) (go-fuse negotiates AUTO_INVAL_DATA).
//
//	nullfs [-size BYTES] [-max-write BYTES] [-max-background N] [-attr-timeout D] [-file PATH [-splice]] MNT
//
// With -file it serves that file's bytes instead: read into each reply, or,
// with -splice, spliced from the file by go-fuse (one copy fewer).
//
// It serves until SIGINT/SIGTERM or an unmount.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

type root struct {
	fs.Inode
	size   int64
	buf    []byte
	src    *os.File // with -file: the bytes served
	splice bool     // with -file: reply with the file's range (spliced), not a copy
}

type file struct {
	fs.Inode
	r *root
}

var (
	_ = (fs.NodeOnAdder)((*root)(nil))
	_ = (fs.NodeGetattrer)((*file)(nil))
	_ = (fs.NodeOpener)((*file)(nil))
	_ = (fs.NodeReader)((*file)(nil))
)

func (r *root) OnAdd(ctx context.Context) {
	ch := r.NewPersistentInode(ctx, &file{r: r}, fs.StableAttr{Ino: 2})
	r.AddChild("data", ch, false)
}

func (f *file) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o444
	out.Size = uint64(f.r.size)
	return 0
}

func (f *file) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_KEEP_CACHE, 0
}

func (f *file) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n := min(int64(len(dest)), max(f.r.size-off, 0))
	switch {
	case f.r.src == nil:
		return fuse.ReadResultData(f.r.buf[:n]), 0
	case f.r.splice:
		return fuse.ReadResultFd(f.r.src.Fd(), off, int(n)), 0
	}
	got, err := f.r.src.ReadAt(dest[:n], off)
	if err != nil && int64(got) < n {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:got]), 0
}

func main() {
	size := flag.Int64("size", 1<<30, "size of the file in bytes")
	maxWrite := flag.Int("max-write", 1<<20, "largest request in bytes (go-fuse MaxWrite)")
	maxReadAhead := flag.Int("max-readahead", 1<<20, "kernel read-ahead in bytes (go-fuse MaxReadAhead)")
	maxBackground := flag.Int("max-background", 0, "background requests (0: go-fuse's default)")
	path := flag.String("file", "", "serve this file's bytes (read into each reply), not a static buffer")
	splice := flag.Bool("splice", false, "with -file: reply with the file's range, spliced by go-fuse")
	attrTimeout := flag.Duration("attr-timeout", 0, "entry and attribute timeout (go-fuse's default 0: with AUTO_INVAL_DATA the kernel asks GETATTR before every read)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: nullfs [flags] MNT")
		os.Exit(2)
	}
	r := &root{size: *size, buf: make([]byte, *maxWrite), splice: *splice}
	for i := range r.buf {
		r.buf[i] = byte(i)
	}
	if *path != "" {
		f, err := os.Open(*path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "nullfs:", err)
			os.Exit(1)
		}
		fi, _ := f.Stat()
		r.src, r.size = f, fi.Size()
	}
	server, err := fs.Mount(flag.Arg(0), r, &fs.Options{EntryTimeout: attrTimeout, AttrTimeout: attrTimeout, MountOptions: fuse.MountOptions{
		FsName: "nullfs", Name: "nullfs", MaxWrite: *maxWrite, MaxReadAhead: *maxReadAhead,
		MaxBackground: *maxBackground, DirectMount: true, DisableSplice: !*splice,
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "nullfs:", err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; server.Unmount() }()
	server.Wait()
}
