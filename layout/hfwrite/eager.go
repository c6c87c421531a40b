package hfwrite

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"

	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/safetensors"
)

// Eager reshard. A file is resharded while it is written: a goroutine per
// file waits for the header to arrive, starts a dcpwrite.Reshard, and feeds
// it the bytes as the contiguous written prefix grows (stream.wait), so
// that Commit only finishes the tail and writes .metadata. While it waits
// it writes the file's queued writes to the spool (stream.go). The attempt
// is dropped, and Commit reshards the complete file instead, whenever its
// input may differ from the final file: a write or truncate that changes
// bytes the resharder may have read, a rename to another kind of file, a
// header that differs from the final one, or any error of the attempt. It
// gives up at once on content that is not safetensors (a sidecar).

var errAbandoned = errors.New("hfwrite: eager reshard abandoned")

// growing is a spool file as the source of a dcpwrite.Reshard.
type growing struct {
	f *os.File
	s *stream
}

func (g growing) ReadAt(b []byte, off int64) (int, error) { return g.f.ReadAt(b, off) }
func (g growing) Wait(end int64) error                    { return g.s.wait(end) }

// eagerRun is the eager reshard of one file.
type eagerRun struct {
	done chan struct{} // closed when the goroutine is done
	// Set before done is closed: the reshard, ready to commit, or nil when
	// it failed or was abandoned (its files are removed then).
	rs  *dcpwrite.Reshard
	err error // why rs is nil, for tests and logs
}

// startEager starts the eager reshard of the file, once. Holding f.mu (or
// before the File is shared).
func (f *File) startEager() {
	if f.eager != nil || f.f == nil || f.sealed || f.done {
		return
	}
	run := &eagerRun{done: make(chan struct{})}
	f.eager = run
	f.stream.serve()
	go f.runEager(f.f, run)
}

// takeEager waits for the eager reshard to end and returns it, ready to
// commit, or nil. The caller then owns it: it must Commit or Discard it.
// Called by the file's Commit or Abort, after its stream was sealed or
// stopped.
func (f *File) takeEager() *dcpwrite.Reshard {
	f.mu.Lock()
	run := f.eager
	f.mu.Unlock()
	if run == nil {
		return nil
	}
	<-run.done
	rs := run.rs
	run.rs = nil
	return rs
}

// runEager is the goroutine of an eager reshard of the spool fd.
func (f *File) runEager(fd *os.File, run *eagerRun) {
	defer close(run.done)
	defer f.stream.unserve()
	src := growing{fd, f.stream}
	h, err := earlyHeader(src)
	if err != nil {
		run.err = err
		return
	}
	rs, err := f.s.dir.Reshard(src, h)
	if err != nil {
		run.err = err
		return
	}
	if err := rs.Run(); err != nil {
		rs.Discard()
		run.err = err
		return
	}
	run.rs = rs
}

// earlyHeader reads and validates the header of a safetensors file being
// written, once its bytes are there. It applies every rule of
// safetensors.ReadHeader but the file size: the size is taken to be the
// one the header declares, which Commit checks when the file is complete.
func earlyHeader(src growing) (*safetensors.Header, error) {
	if err := src.Wait(8); err != nil {
		return nil, err
	}
	var pre [8]byte
	if _, err := src.ReadAt(pre[:], 0); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint64(pre[:])
	if n > safetensors.MaxHeaderSize {
		return nil, fmt.Errorf("hfwrite: header length %d too large", n)
	}
	if err := src.Wait(8 + int64(n)); err != nil {
		return nil, err
	}
	// Wait returns at once when the file is complete: allocate no more
	// than it holds.
	if fi, err := src.f.Stat(); err != nil || fi.Size() < 8+int64(n) {
		return nil, fmt.Errorf("hfwrite: file shorter than its header length %d", n)
	}
	buf := make([]byte, 8+n)
	if _, err := src.ReadAt(buf, 0); err != nil {
		return nil, err
	}
	// The end of the data, as the header declares it.
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(buf[8:], &entries); err != nil {
		return nil, err
	}
	var end int64
	for k, raw := range entries {
		if k == "__metadata__" {
			continue
		}
		var e struct {
			DataOffsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &e); err != nil || len(e.DataOffsets) != 2 {
			return nil, fmt.Errorf("hfwrite: tensor %q: no data_offsets", k)
		}
		end = max(end, e.DataOffsets[1])
	}
	if end > math.MaxInt64-int64(len(buf)) {
		return nil, errors.New("hfwrite: data offsets overflow")
	}
	return safetensors.ReadHeader(bytes.NewReader(buf), int64(len(buf))+end)
}
