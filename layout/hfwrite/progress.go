package hfwrite

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"

	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/safetensors"
)

// Eager reshard. A tensor file is resharded while it is written: a
// goroutine per file waits for the header to arrive, starts a
// dcpwrite.Reshard, and feeds it the bytes as the contiguous written prefix
// grows, so that Commit only finishes the tail and writes .metadata. The
// attempt is dropped, and Commit reshards the complete file instead,
// whenever its input may differ from the final file: a write or truncate
// that changes bytes the resharder may have read, a rename to another kind
// of file, a header that differs from the final one, or any error of the
// attempt.

// maxSpans bounds the written ranges a file tracks (a writer filling holes
// in random order); past it the eager attempt is dropped.
const maxSpans = 4096

var errAbandoned = errors.New("hfwrite: eager reshard abandoned")

type span struct{ off, end int64 }

// progress tracks the writes of a spool file for its eager reshard.
type progress struct {
	mu       sync.Mutex
	cond     sync.Cond
	done     []span // GUARDED_BY(mu): bytes written, sorted, merged
	inflight []span // GUARDED_BY(mu): writes under way
	claimed  int64  // GUARDED_BY(mu): bytes below it may have been read by the resharder
	want     int64  // GUARDED_BY(mu): the least end a resharder worker waits for, 0 if none
	broken   bool   // GUARDED_BY(mu): claimed bytes may have changed: the attempt is void
	stopped  bool   // GUARDED_BY(mu): the file was aborted
	sealed   bool   // GUARDED_BY(mu): no more writes; every byte is final
}

func newProgress() *progress {
	p := &progress{}
	p.cond.L = &p.mu
	return p
}

// prefix is the end of the contiguous written bytes from 0. Holding mu.
func (p *progress) prefix() int64 {
	if len(p.done) > 0 && p.done[0].off == 0 {
		return p.done[0].end
	}
	return 0
}

// wake wakes the resharder's workers if what one waits for may have
// happened; they register again what they still wait for. Holding mu.
func (p *progress) wake() {
	if p.broken || p.stopped || p.sealed || (p.want > 0 && p.prefix() >= p.want) {
		p.want = 0
		p.cond.Broadcast()
	}
}

// begin registers a write of n bytes at off before it is done; a write of
// bytes the resharder may have read breaks the attempt. It fails once the
// file is sealed.
func (p *progress) begin(off, n int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sealed {
		return ErrDone
	}
	if n <= 0 {
		return nil
	}
	if off < p.claimed || off < 0 || off > math.MaxInt64-n {
		p.broken = true
		p.wake()
	}
	p.inflight = append(p.inflight, span{off, off + n})
	return nil
}

// end records the write registered by begin(off, n), of which written
// bytes were written.
func (p *progress) end(off, n, written int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n <= 0 {
		return
	}
	for i, s := range p.inflight {
		if s == (span{off, off + n}) {
			p.inflight = append(p.inflight[:i], p.inflight[i+1:]...)
			break
		}
	}
	if written > 0 && !p.broken {
		p.add(span{off, off + written})
	}
	if p.sealed && len(p.inflight) == 0 {
		p.cond.Broadcast() // seal waits for this
	}
	p.wake()
}

// add merges s into done. Holding mu.
func (p *progress) add(s span) {
	i := 0
	for i < len(p.done) && p.done[i].end < s.off {
		i++
	}
	j := i
	for j < len(p.done) && p.done[j].off <= s.end {
		s.off = min(s.off, p.done[j].off)
		s.end = max(s.end, p.done[j].end)
		j++
	}
	p.done = append(p.done[:i], append([]span{s}, p.done[j:]...)...)
	if len(p.done) > maxSpans {
		p.broken, p.done = true, nil
	}
}

// truncate runs do, the truncation of the file to size, holding mu so that
// the resharder claims nothing meanwhile. Cutting bytes the resharder may
// have read breaks the attempt.
func (p *progress) truncate(size int64, do func() error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sealed {
		return ErrDone
	}
	if size < p.claimed {
		p.broken = true
	}
	err := do()
	if err != nil && size < p.maxEnd() {
		p.broken = true // the size is unknown now
	}
	// Bytes cut are no longer written (they read as zeros when extended).
	done := p.done[:0]
	for _, s := range p.done {
		if s.off < size {
			done = append(done, span{s.off, min(s.end, size)})
		}
	}
	p.done = done
	p.wake()
	return err
}

// maxEnd is the end of the last byte written or being written. Holding mu.
func (p *progress) maxEnd() int64 {
	var e int64
	if len(p.done) > 0 {
		e = p.done[len(p.done)-1].end
	}
	for _, s := range p.inflight {
		e = max(e, s.end)
	}
	return e
}

// abandon breaks the attempt (a rename to another kind of file).
func (p *progress) abandon() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.broken = true
	p.wake()
}

// stop makes the resharder give up (the file is aborted).
func (p *progress) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	p.wake()
}

// seal ends the writes: it waits for those under way, and from then on
// every byte is final and wait returns at once.
func (p *progress) seal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sealed = true
	for len(p.inflight) > 0 {
		p.cond.Wait()
	}
	p.cond.Broadcast()
}

// valid reports whether nothing the resharder may have read has changed.
func (p *progress) valid() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.broken && !p.stopped
}

// wait blocks until the bytes below end are written and no write under
// way changes them, then claims them: changing them later breaks the
// attempt.
func (p *progress) wait(end int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.broken || p.stopped {
			return errAbandoned
		}
		// Sealed, every byte is final once the writes under way (queued
		// by writeBehind) are in.
		if (p.sealed && len(p.inflight) == 0) || (p.prefix() >= end && !p.writing(p.claimed, end)) {
			p.claimed = max(p.claimed, end)
			return nil
		}
		if p.want == 0 || end < p.want {
			p.want = end
		}
		p.cond.Wait()
	}
}

// writing reports whether a write under way touches [off, end). Holding mu.
func (p *progress) writing(off, end int64) bool {
	for _, s := range p.inflight {
		if s.off < end && off < s.end {
			return true
		}
	}
	return false
}

// growing is a spool file as the source of a dcpwrite.Reshard.
type growing struct {
	f *os.File
	p *progress
}

func (g growing) ReadAt(b []byte, off int64) (int, error) { return g.f.ReadAt(b, off) }
func (g growing) Wait(end int64) error                    { return g.p.wait(end) }

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
	go f.runEager(f.f, run)
}

// takeEager waits for the eager reshard to end and returns it, ready to
// commit, or nil. The caller then owns it: it must Commit or Discard it.
// Called holding f.commitMu, after prog was sealed or stopped.
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
	src := growing{fd, f.prog}
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
