// Package diskcache keeps blocks of a remote tree's files on local disk, so
// that a restarted mount does not fetch them again. A block is the aligned
// range [i×BlockSize, (i+1)×BlockSize) of one version of one file, stored
// under a hash of (the file's Path, its Version, BlockSize, i): a changed
// object has a new Version (its ETag), so its old blocks are never served
// for it; they age out.
//
// Correctness never depends on the cache: a block is written to a temporary
// file and renamed into place, carries its length and CRC-32C (checked when
// a process first reads it; later reads read just their range), and one
// that is missing, short or corrupt is removed and fetched from the source
// again.
// A block that cannot be written is just not cached. The directory is
// bounded by MaxBytes, least recently used blocks first; one process uses
// it at a time (a lock file says so).
package diskcache

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/sync/singleflight"

	"github.com/ckptfs/ckptfs/layout/source"
)

// Options configure a Cache.
type Options struct {
	Dir       string // created if missing
	MaxBytes  int64  // bound on the blocks kept (headers included)
	BlockSize int64  // bytes per block
}

// Cache is a directory of blocks.
type Cache struct {
	opts Options
	lock *source.Lock // held while open
	sf   singleflight.Group

	// simplelru bounds by entry count and blocks vary in size: lru is
	// unbounded and trimLocked keeps size under MaxBytes (no eviction
	// callback, which would remove files while holding mu).
	mu   sync.Mutex
	lru  *simplelru.LRU[string, *entry] // GUARDED_BY(mu); by file name
	size int64                          // GUARDED_BY(mu); bytes of all entries

	hits, misses, errs atomic.Int64
}

type entry struct {
	name     string
	size     int64
	verified bool // checked whole by this process (or written by it)
}

const (
	magic      = "CKPTFSB1"
	headerSize = len(magic) + 4 + 8 // magic, CRC-32C, data length
	suffix     = ".blk"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Open opens (creating it if needed) the cache directory, indexes the
// blocks already there, oldest first, and trims it to MaxBytes.
func Open(o Options) (*Cache, error) {
	if o.MaxBytes <= 0 || o.BlockSize <= 0 {
		return nil, fmt.Errorf("diskcache: %s: size %d and block size %d must be positive", o.Dir, o.MaxBytes, o.BlockSize)
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("diskcache: %w", err)
	}
	lock, err := lockDir(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("diskcache: %w", err)
	}
	index, err := simplelru.NewLRU[string, *entry](math.MaxInt, nil)
	if err != nil {
		lock.Release()
		return nil, fmt.Errorf("diskcache: %w", err)
	}
	c := &Cache{opts: o, lock: lock, lru: index}
	if err := c.scan(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close releases the directory.
func (c *Cache) Close() error { return c.lock.Release() }

// lockDir takes the lock of the cache directory dir: its file "lock".
func lockDir(dir string) (*source.Lock, error) {
	d, err := source.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if f, err := d.OpenFile("lock", os.O_RDONLY|os.O_CREATE, 0o600); err != nil {
		return nil, err
	} else {
		f.Close()
	}
	return d.TryLock("lock")
}

// scan indexes the blocks on disk, oldest written first, and removes
// temporary files of writes that were interrupted.
func (c *Cache) scan() error {
	ents, err := os.ReadDir(c.opts.Dir)
	if err != nil {
		return fmt.Errorf("diskcache: %w", err)
	}
	type found struct {
		entry
		mtime int64
	}
	var blocks []found
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			os.Remove(filepath.Join(c.opts.Dir, name))
			continue
		}
		fi, err := e.Info()
		if err != nil || !strings.HasSuffix(name, suffix) || !fi.Mode().IsRegular() {
			continue
		}
		blocks = append(blocks, found{entry{name: name, size: fi.Size()}, fi.ModTime().UnixNano()})
	}
	sort.Slice(blocks, func(i, j int) bool { return blocks[i].mtime < blocks[j].mtime })
	c.mu.Lock()
	for _, b := range blocks {
		e := b.entry
		c.lru.Add(e.name, &e)
		c.size += e.size
	}
	victims := c.trimLocked()
	c.mu.Unlock()
	c.remove(victims)
	return nil
}

// Wrap returns t with its files' reads served through the cache. The
// result counts disk hits and misses besides t's own traffic.
func (c *Cache) Wrap(t source.Tree) source.Tree { return &tree{Tree: t, c: c} }

// Stats are the cache's counters (the Disk* fields of source.Stats).
func (c *Cache) Stats() source.Stats {
	c.mu.Lock()
	size := c.size
	c.mu.Unlock()
	return source.Stats{DiskHits: c.hits.Load(), DiskMisses: c.misses.Load(), DiskBytes: size, DiskErrors: c.errs.Load()}
}

type tree struct {
	source.Tree
	c *Cache
}

var (
	_ source.Tree    = (*tree)(nil)
	_ source.Counted = (*tree)(nil)
)

func (t *tree) Open(name string) (source.File, error) {
	f, err := t.Tree.Open(name)
	if err != nil {
		return nil, err
	}
	return &file{File: f, c: t.c, id: t.Tree.Path(name) + "\x00" + f.Info().Version}, nil
}

func (t *tree) Stats() source.Stats {
	s := t.c.Stats()
	if b, ok := t.Tree.(source.Counted); ok {
		bs := b.Stats()
		s.Requests, s.BytesFetched, s.Retries, s.Errors = bs.Requests, bs.BytesFetched, bs.Retries, bs.Errors
	}
	return s
}

// file reads whole blocks of the source file through the cache.
type file struct {
	source.File
	c  *Cache
	id string // path and version: what a block's key is made of
}

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	size := f.Info().Size
	if off < 0 {
		return 0, fmt.Errorf("diskcache: negative offset %d", off)
	}
	if off >= size {
		return 0, io.EOF
	}
	bs := f.c.opts.BlockSize
	end := min(off+int64(len(p)), size)
	for pos := off; pos < end; {
		idx := pos / bs
		dst := p[pos-off : min(end, (idx+1)*bs)-off]
		if err := f.c.read(f, idx, dst, pos-idx*bs); err != nil {
			return int(pos - off), err
		}
		pos += int64(len(dst))
	}
	if n := int(end - off); n < len(p) {
		return n, io.EOF
	}
	return len(p), nil
}

// read fills dst with the bytes at off in block idx of f: from disk, else
// from the source (once for concurrent readers), stored for next time.
func (c *Cache) read(f *file, idx int64, dst []byte, off int64) error {
	bs := c.opts.BlockSize
	want := min(bs, f.Info().Size-idx*bs)
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d\x00%d", f.id, bs, idx)))
	name := hex.EncodeToString(sum[:]) + suffix
	if c.load(name, want, dst, off) {
		c.hits.Add(1)
		return nil
	}
	v, err, _ := c.sf.Do(name, func() (any, error) {
		c.misses.Add(1)
		b := make([]byte, want)
		n, err := f.File.ReadAt(b, idx*bs)
		if int64(n) == want && errors.Is(err, io.EOF) {
			err = nil
		}
		if err != nil {
			return nil, err
		}
		c.store(name, b)
		return b, nil
	})
	if err != nil {
		return err
	}
	copy(dst, v.([]byte)[off:])
	return nil
}

// load fills dst from the block on disk. A block is checked whole (length
// and CRC) the first time this process reads it, then read in place; a bad
// one is removed.
func (c *Cache) load(name string, want int64, dst []byte, off int64) bool {
	c.mu.Lock()
	e, ok := c.lru.Get(name)
	var verified bool
	if ok {
		verified = e.verified
	}
	c.mu.Unlock()
	if !ok {
		return false
	}
	path := filepath.Join(c.opts.Dir, name)
	if verified {
		if fd, err := os.Open(path); err == nil {
			n, err := fd.ReadAt(dst, int64(headerSize)+off)
			fd.Close()
			if n == len(dst) && (err == nil || err == io.EOF) {
				return true
			}
		}
	} else {
		raw, err := os.ReadFile(path)
		if err == nil && len(raw) == headerSize+int(want) && string(raw[:len(magic)]) == magic &&
			binary.LittleEndian.Uint64(raw[len(magic)+4:headerSize]) == uint64(want) &&
			binary.LittleEndian.Uint32(raw[len(magic):]) == crc32.Checksum(raw[headerSize:], castagnoli) {
			c.mu.Lock()
			if e, ok := c.lru.Peek(name); ok {
				e.verified = true
			}
			c.mu.Unlock()
			copy(dst, raw[int64(headerSize)+off:])
			return true
		}
	}
	c.errs.Add(1)
	c.forget(name)
	return false
}

// store writes a block (temporary file, then rename) and trims the cache.
// Failure only means the block is not cached.
func (c *Cache) store(name string, b []byte) {
	hdr := make([]byte, headerSize, headerSize+len(b))
	copy(hdr, magic)
	binary.LittleEndian.PutUint32(hdr[len(magic):], crc32.Checksum(b, castagnoli))
	binary.LittleEndian.PutUint64(hdr[len(magic)+4:], uint64(len(b)))
	path := filepath.Join(c.opts.Dir, name)
	tmp, err := os.CreateTemp(c.opts.Dir, name+".*.tmp")
	if err == nil {
		_, err = tmp.Write(append(hdr, b...))
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), path)
		}
		if err != nil {
			os.Remove(tmp.Name())
		}
	}
	if err != nil {
		c.errs.Add(1)
		return
	}
	size := int64(headerSize + len(b))
	c.mu.Lock()
	if e, ok := c.lru.Peek(name); ok {
		c.size -= e.size
	}
	c.lru.Add(name, &entry{name: name, size: size, verified: true}) // replaces, most recent
	c.size += size
	victims := c.trimLocked()
	c.mu.Unlock()
	c.remove(victims)
}

// trimLocked drops the least recently used entries over MaxBytes from the
// index and returns their names, to be removed from disk without the lock.
func (c *Cache) trimLocked() []string {
	var victims []string
	for c.size > c.opts.MaxBytes {
		_, e, ok := c.lru.RemoveOldest()
		if !ok {
			break
		}
		c.size -= e.size
		victims = append(victims, e.name)
	}
	return victims
}

func (c *Cache) forget(name string) {
	c.mu.Lock()
	if e, ok := c.lru.Peek(name); ok {
		c.size -= e.size
		c.lru.Remove(name)
	}
	c.mu.Unlock()
	c.remove([]string{name})
}

func (c *Cache) remove(names []string) {
	for _, n := range names {
		os.Remove(filepath.Join(c.opts.Dir, n))
	}
}
