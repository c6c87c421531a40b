// Package open opens a source by its location, in one place for every
// command: a local directory, an HF hub cache snapshot (confined to its
// repo folder, whose blobs/ its files link into) or an object store prefix
// (s3://, gs://, az://; read through a disk cache of blocks when asked),
// optionally confined to a root above it. What is read through the Source cannot leave that root.
package open

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/azure"
	"github.com/ckptfs/ckptfs/layout/source/diskcache"
	"github.com/ckptfs/ckptfs/layout/source/gcs"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
	"github.com/ckptfs/ckptfs/layout/source/s3"
)

// Limits bound every request to an object store, whatever its scheme
// (objstore.Limits): callers set them without naming a store's package.
type Limits = objstore.Limits

// The bounds of a zero field of Limits.
const (
	DefaultMaxAttempts = objstore.DefaultMaxAttempts
	DefaultReadTimeout = objstore.DefaultReadTimeout
	DefaultMinRate     = objstore.DefaultMinRate
)

// Options say how a source is opened.
type Options struct {
	// Writable opens a local directory to be written into: confined to
	// the directory itself (never widened to a hub cache's repo folder).
	// A remote source cannot be.
	Writable bool
	// S3 says how an s3:// source is reached.
	S3 s3.Options
	// GCS says how a gs:// source is reached.
	GCS gcs.Options
	// Azure says how an az:// source is reached.
	Azure azure.Options
	// CacheDir, when set, keeps the store's blocks of BlockSize bytes on
	// local disk, within CacheDirSize bytes, so a restart does not fetch
	// them again.
	CacheDir     string
	CacheDirSize int64
	BlockSize    int64
}

// SetAhead sets the read-ahead of every store's objects read in order
// (objstore.Limits.MinRequest and AheadMemory; readpath.For sizes them).
func (o *Options) SetAhead(minRequest, memory int64) {
	o.S3.MinRequest, o.S3.AheadMemory = minRequest, memory
	o.GCS.Limits.MinRequest, o.GCS.Limits.AheadMemory = minRequest, memory
	o.Azure.Limits.MinRequest, o.Azure.Limits.AheadMemory = minRequest, memory
}

// Source is an open source: a tree confined to the root asked for, and
// the location's directory in it.
type Source struct {
	// Tree is confined to the root given to Open, else to the location
	// itself (a hub cache snapshot: to its repo folder).
	Tree source.Tree
	// Rel is the location's directory in Tree, "." when it is Tree's top.
	Rel string
	// Hub says Tree is an HF hub cache repo folder (refs/, snapshots/,
	// blobs/).
	Hub bool
	// Store is the object store of a remote source (to interrupt its
	// requests, see objstore.Tree.Drain); nil for a local one.
	Store *objstore.Tree

	closers []io.Closer
}

// IsRemote reports whether loc names an object store location, not a local
// directory.
func IsRemote(loc string) bool { return Scheme(loc) != "" }

// Scheme is the URL scheme of the object store loc names (s3.Scheme,
// gcs.Scheme or azure.Scheme), or "" for a local directory.
func Scheme(loc string) string {
	for _, s := range []string{s3.Scheme, gcs.Scheme, azure.Scheme} {
		if strings.HasPrefix(loc, s) {
			return s
		}
	}
	return ""
}

// schemes are the object stores by URL scheme.
var schemes = []struct {
	is    func(string) bool
	parse func(string) (objstore.Location, error)
	open  func(ctx context.Context, url string, o Options) (*objstore.Tree, error)
}{
	{s3.IsURL, s3.ParseURL, func(ctx context.Context, url string, o Options) (*objstore.Tree, error) {
		return s3.Open(ctx, url, o.S3)
	}},
	{gcs.IsURL, gcs.ParseURL, func(ctx context.Context, url string, o Options) (*objstore.Tree, error) {
		return gcs.Open(ctx, url, o.GCS)
	}},
	{azure.IsURL, azure.ParseURL, func(ctx context.Context, url string, o Options) (*objstore.Tree, error) {
		return azure.Open(ctx, url, o.Azure)
	}},
}

// Open opens the source at loc confined to root, or to loc itself when root
// is "". A local loc with no root inside an HF hub cache is confined to its
// repo folder (Hub), unless o.Writable.
func Open(ctx context.Context, loc, root string, o Options) (*Source, error) {
	if IsRemote(loc) || IsRemote(root) {
		if o.Writable {
			return nil, fmt.Errorf("%s: only a local directory can be written", loc)
		}
		return openRemote(ctx, loc, root, o)
	}
	return openLocal(loc, root, o.Writable)
}

// Close releases the tree and what it reads through.
func (s *Source) Close() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i].Close())
	}
	return errors.Join(errs...)
}

// Dir is the tree of the location itself (Rel in Tree), confined as Tree.
func (s *Source) Dir() (source.Tree, error) { return source.Sub(s.Tree, s.Rel) }

func openLocal(dir, root string, writable bool) (*Source, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if root != "" {
		if root, err = filepath.Abs(root); err != nil {
			return nil, err
		}
		rel, err := filepath.Rel(root, dir)
		if err != nil || !filepath.IsLocal(rel) && rel != "." {
			return nil, fmt.Errorf("%s is not inside --root %s", dir, root)
		}
		t, err := source.OpenLocal(root)
		if err != nil {
			return nil, err
		}
		return &Source{Tree: t, Rel: filepath.ToSlash(rel), closers: []io.Closer{t}}, nil
	}
	if !writable {
		repo, rel, err := source.OpenHub(dir)
		if err != nil {
			return nil, err
		}
		if repo != nil {
			return &Source{Tree: repo, Rel: rel, Hub: true, closers: []io.Closer{repo}}, nil
		}
	}
	t, err := source.OpenLocal(dir)
	if err != nil {
		return nil, err
	}
	return &Source{Tree: t, Rel: ".", closers: []io.Closer{t}}, nil
}

func openRemote(ctx context.Context, loc, root string, o Options) (*Source, error) {
	top, rel, err := remoteRoot(loc, root)
	if err != nil {
		return nil, err
	}
	var store *objstore.Tree
	for _, sc := range schemes {
		if sc.is(top) {
			store, err = sc.open(ctx, top, o)
			break
		}
	}
	if err != nil {
		return nil, err
	}
	s := &Source{Tree: store, Rel: rel, Store: store, closers: []io.Closer{store}}
	if o.CacheDir != "" {
		c, err := diskcache.Open(diskcache.Options{Dir: o.CacheDir, MaxBytes: o.CacheDirSize, BlockSize: o.BlockSize})
		if err != nil {
			store.Close()
			return nil, fmt.Errorf("--cache-dir: %w", err)
		}
		s.Tree, s.closers = c.Wrap(store), append(s.closers, c)
	}
	return s, nil
}

// remoteRoot returns the location to open for loc confined to root (loc
// itself when root is "") and loc's directory in it.
func remoteRoot(loc, root string) (top, rel string, err error) {
	for _, sc := range schemes {
		if !sc.is(loc) {
			continue
		}
		l, err := sc.parse(loc)
		if err != nil || root == "" {
			return loc, ".", err
		}
		r, err := sc.parse(root)
		if err != nil {
			return "", "", fmt.Errorf("--root: %w", err)
		}
		if rel, err = objstore.Within(l, r); err != nil {
			return "", "", err
		}
		return root, rel, nil
	}
	return "", "", fmt.Errorf("%s is not inside --root %s", loc, root)
}
