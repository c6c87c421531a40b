// Package export writes a view out as an HF directory: the view's files,
// read with a few workers, into a temporary directory beside the output
// that is renamed into place once complete, so an interrupted export leaves
// no partial model under the output's name.
package export

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/view"
)

// Options tune Write.
type Options struct {
	// BlockSize is the unit of reading (default 8 MiB).
	BlockSize int64
	// Workers read blocks ahead in parallel (default 4). Memory in flight is
	// about (Workers+1) × BlockSize.
	Workers int
	// Progress, if set, is called after each block with bytes written so far
	// and the total.
	Progress func(done, total int64)
}

// Write writes the view as an ordinary HF directory at out, which must not
// exist (its missing parents are made). Files are streamed into a temporary directory beside out, synced,
// and the directory is renamed into place at the end, so out either holds the
// whole view or does not exist. Temporary directories that earlier exports to
// out left behind (killed ones) are removed first; those of exports still
// running are not (see temp.go).
//
// When ctx is canceled, Write removes its temporary directory and returns
// ctx.Err(), without waiting for reads already under way.
func Write(ctx context.Context, v *view.View, out string, opts Options) (err error) {
	if opts.BlockSize <= 0 {
		opts.BlockSize = 8 << 20
	}
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := os.Lstat(out); err == nil {
		return fmt.Errorf("export: %s already exists", out)
	}
	tmp, err := newExportTemp(out)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.discard()
		} else {
			tmp.close()
		}
	}()
	total := v.TotalSize()
	var done int64
	for _, f := range v.Files {
		err := writeFile(ctx, tmp.dir, f, opts, func(n int64) {
			done += n
			if opts.Progress != nil {
				opts.Progress(done, total)
			}
		})
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return fmt.Errorf("export: %w", err)
		}
	}
	if err := tmp.dir.Sync("."); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := tmp.commit(out); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}

// writeFile writes the view file f into dir under its own name (a name
// from the checkpoint: dir keeps it inside).
func writeFile(ctx context.Context, dir *source.Dir, f *view.File, opts Options, progress func(int64)) error {
	out, err := dir.Create(f.Name, 0o644)
	if err != nil {
		return err
	}
	if err := copyParallel(ctx, out, f, f.Size, opts.BlockSize, opts.Workers, progress); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return dir.Chtimes(f.Name, f.ModTime, f.ModTime)
}

// copyParallel copies size bytes of src to dst in blocks, reading up to
// workers blocks concurrently and writing them in order. It returns
// ctx.Err() as soon as ctx is canceled; reads under way finish on their own.
func copyParallel(ctx context.Context, dst io.Writer, src io.ReaderAt, size, block int64, workers int, progress func(int64)) error {
	type result struct {
		buf []byte
		err error
	}
	pending := make(chan chan result, workers)
	stop := make(chan struct{})
	defer close(stop)
	free := make(chan []byte, workers+2)
	go func() {
		defer close(pending)
		for off := int64(0); off < size; off += block {
			ch := make(chan result, 1)
			select {
			case pending <- ch:
			case <-stop:
				return
			}
			var buf []byte
			select {
			case buf = <-free:
			default:
				buf = make([]byte, block)
			}
			go func(off int64, buf []byte) {
				n := min(block, size-off)
				got, err := src.ReadAt(buf[:n], off)
				if errors.Is(err, io.EOF) && int64(got) == n {
					err = nil
				}
				ch <- result{buf[:n], err}
			}(off, buf)
		}
	}()
	for ch := range pending {
		var r result
		select {
		case r = <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		if r.err != nil {
			return r.err
		}
		if _, err := dst.Write(r.buf); err != nil {
			return err
		}
		progress(int64(len(r.buf)))
		select {
		case free <- r.buf[:cap(r.buf)]:
		default:
		}
	}
	return nil
}
