package s3

import (
	"container/list"
	"fmt"
	"sync"

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
	mu    sync.Mutex
	lru   *list.List               // GUARDED_BY(mu); of *window, most recent first
	index map[string]*list.Element // GUARDED_BY(mu)
}

type window struct {
	key  string
	data []byte
}

func newWindows() *windows {
	return &windows{lru: list.New(), index: map[string]*list.Element{}}
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
	key := fmt.Sprintf("%s\x00%s\x00%d", f.key, f.info.Version, idx)
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
	ws.mu.Lock()
	if el, ok := ws.index[key]; ok {
		ws.lru.MoveToFront(el)
		ws.mu.Unlock()
		return el.Value.(*window).data, nil
	}
	ws.mu.Unlock()
	v, err, _ := ws.sf.Do(key, func() (any, error) {
		data, err := fetch()
		if err != nil {
			return nil, err
		}
		ws.mu.Lock()
		defer ws.mu.Unlock()
		if _, ok := ws.index[key]; !ok {
			ws.index[key] = ws.lru.PushFront(&window{key, data})
			for ws.lru.Len() > maxWindows {
				delete(ws.index, ws.lru.Remove(ws.lru.Back()).(*window).key)
			}
		}
		return data, nil
	})
	if err != nil {
		return nil, err
	}
	return v.([]byte), nil
}
