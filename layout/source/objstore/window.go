package objstore

import (
	"fmt"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/singleflight"
)

// Format readers parse records with runs of tiny reads (a zip local header,
// then its name, then its extra field; a safetensors length, then its
// header): one request each would make the first touch of every tensor a
// dozen round trips. A small read is served from the aligned window around
// it, fetched once and kept among the tree's most recent windows.
const (
	smallRead  = 16 << 10 // reads up to this size go through a window
	windowSize = 64 << 10
	maxWindows = 64 // per tree: 4 MiB
)

// windows are the most recently fetched windows of a tree's objects.
type windows struct {
	sf    singleflight.Group
	cache *lru.Cache[string, []byte]
}

func newWindows() *windows {
	c, err := lru.New[string, []byte](maxWindows)
	if err != nil {
		panic(err) // only for a size <= 0
	}
	return &windows{cache: c}
}

// read serves p at off from the window of f that holds it; ok is false when
// the read is not small or crosses a window boundary.
func (ws *windows) read(f *file, p []byte, off int64) (n int, ok bool, err error) {
	idx := off / windowSize
	start := idx * windowSize
	if len(p) > smallRead || off+int64(len(p)) > start+windowSize {
		return 0, false, nil
	}
	// The ETag is part of the key: windows of an old version are never
	// served for a new one.
	key := fmt.Sprintf("%s\x00%s\x00%d", f.obj.Key, f.obj.Version, idx)
	data, err := ws.get(key, func() ([]byte, error) {
		b := make([]byte, min(windowSize, f.info.Size-start))
		n, err := f.read(b, start)
		return b[:n], err
	})
	if err != nil {
		return 0, true, err
	}
	return copy(p, data[off-start:]), true, nil
}

func (ws *windows) get(key string, fetch func() ([]byte, error)) ([]byte, error) {
	if data, ok := ws.cache.Get(key); ok {
		return data, nil
	}
	v, err, _ := ws.sf.Do(key, func() (any, error) {
		data, err := fetch()
		if err != nil {
			return nil, err
		}
		ws.cache.ContainsOrAdd(key, data)
		return data, nil
	})
	if err != nil {
		return nil, err
	}
	return v.([]byte), nil
}
