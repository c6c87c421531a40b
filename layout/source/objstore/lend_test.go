package objstore

import (
	"bytes"
	"context"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
)

// gate holds a body's bytes until it is opened past them, so that a test
// knows which reads wait at a stream's frontier.
type gate struct {
	mu        sync.Mutex
	open      int64
	ch        chan struct{}
	delivered atomic.Int64
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) state() (int64, chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open, g.ch
}

func (g *gate) openTo(n int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = n
	close(g.ch)
	g.ch = make(chan struct{})
}

// gatedBody is data[at:end] as the gate lets it through.
type gatedBody struct {
	ctx     context.Context
	g       *gate
	data    []byte
	at, end int64
}

func (b *gatedBody) Read(p []byte) (int, error) {
	if b.at >= b.end {
		return 0, io.EOF
	}
	for {
		open, ch := b.g.state()
		if open > b.at {
			n := copy(p, b.data[b.at:min(b.end, open)])
			b.at += int64(n)
			b.g.delivered.Add(int64(n))
			return n, nil
		}
		select {
		case <-ch:
		case <-b.ctx.Done():
			return 0, b.ctx.Err()
		}
	}
}

// lendsWaiting is the lends registered on the streams of f.
func lendsWaiting(tree *Tree, f source.File) int {
	tree.ahead.mu.Lock()
	defer tree.ahead.mu.Unlock()
	n := 0
	for _, s := range f.(*file).streams {
		n += len(s.lends)
	}
	return n
}

// readAsync reads len(p) bytes at off in a goroutine; its error comes on
// the channel.
func readAsync(f source.File, p []byte, off int64) chan error {
	done := make(chan error, 1)
	go func() {
		_, err := f.ReadAt(p, off)
		done <- err
	}()
	return done
}

func waitLends(t *testing.T, tree *Tree, f source.File, k int) {
	t.Helper()
	require.Eventually(t, func() bool { return lendsWaiting(tree, f) == k }, 30*time.Second, time.Millisecond,
		"lends registered")
}

// Fills waiting at and past a stream's frontier (the block cache's
// read-ahead) get the body straight into their buffers: no byte is copied
// out of a piece and no piece is taken, in one request.
func TestAheadLendsToWaitingReaders(t *testing.T) {
	const size, req, block = 4 << 20, 4 << 20, 1 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	m.gate = newGate()
	ps := make([][]byte, size/block)
	dones := make([]chan error, size/block)
	for i := range ps {
		ps[i] = make([]byte, block)
		dones[i] = readAsync(f, ps[i], int64(i*block))
		waitLends(t, tree, f, i+1) // the first starts the stream; in order, so that each is past the frontier
	}
	m.gate.openTo(size)
	for i := range ps {
		require.NoError(t, <-dones[i])
		require.Equal(t, m.data[i*block:(i+1)*block], ps[i], "block %d", i)
	}
	checkHeld(t, tree.ahead)
	a := tree.ahead
	assert.Equal(t, int64(size), a.lentBytes.Load(), "bytes read straight into the readers' buffers")
	assert.Zero(t, a.copiedBytes.Load(), "bytes copied out of pieces")
	a.mu.Lock()
	assert.Zero(t, a.used+a.freeN, "piece buffers taken")
	a.mu.Unlock()
	assert.Equal(t, int64(1), m.count.Requests.Load())
	assert.Equal(t, int64(size), m.count.Bytes.Load())
}

// A lend inside a piece: the bytes before and after it go into the piece,
// the lent span is in none (a read of it again is a plain GET of the right
// bytes), and reads across the hole get every byte right.
func TestAheadLendInsideAPiece(t *testing.T) {
	const size, req = 4 << 20, 4 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	m.gate = newGate()
	p0 := make([]byte, 1<<20)
	done0 := readAsync(f, p0, 0)
	waitLends(t, tree, f, 1)
	const lo, n = 1<<20 + 300<<10, 400 << 10
	p1 := make([]byte, n)
	done1 := readAsync(f, p1, lo)
	waitLends(t, tree, f, 2)
	m.gate.openTo(size)
	require.NoError(t, <-done0)
	require.NoError(t, <-done1)
	require.Equal(t, m.data[:1<<20], p0)
	require.Equal(t, m.data[lo:lo+n], p1)
	checkHeld(t, tree.ahead)
	a := tree.ahead
	assert.Equal(t, int64(1<<20+n), a.lentBytes.Load())
	assert.Equal(t, int64(1), m.count.Requests.Load())

	p := make([]byte, 3<<20) // the piece's head, the hole, its tail and the pieces after
	_, err := f.ReadAt(p, 1<<20)
	require.NoError(t, err)
	require.Equal(t, m.data[1<<20:], p)
	assert.GreaterOrEqual(t, a.copiedBytes.Load(), int64(300<<10), "the bytes before the hole, from the piece")
	assert.Equal(t, int64(2), m.count.Requests.Load(), "the rest after the hole is one plain read")
	_, err = f.ReadAt(p1, lo)
	require.NoError(t, err)
	require.Equal(t, m.data[lo:lo+n], p1, "the lent span read again")
	checkHeld(t, tree.ahead)
}

// A body cut while it is read into a lend resumes with the same pin; one
// replaced at the cut fails the read past it with ErrChanged, and the bytes
// the read got are all of the version opened.
func TestAheadLendOfACutBody(t *testing.T) {
	for _, replaced := range []bool{false, true} {
		const size, req = 4 << 20, 4 << 20
		tree, m, f := aheadTree(t, size, req, 4*req)
		old := bytes.Clone(m.data)
		m.gate = newGate()
		cut := int64(1<<20 + 12345)
		m.mu.Lock()
		m.cutAt = cut
		if replaced {
			m.replaceAtCut = bytes.Clone(old)
			for i := range m.replaceAtCut {
				m.replaceAtCut[i] ^= 0xff
			}
		}
		m.mu.Unlock()
		p := make([]byte, 2<<20)
		var n int
		var err error
		done := make(chan struct{})
		go func() {
			defer close(done)
			n, err = f.ReadAt(p, 0)
		}()
		waitLends(t, tree, f, 1)
		m.gate.openTo(size)
		<-done
		assert.GreaterOrEqual(t, tree.ahead.lentBytes.Load(), cut, "replaced %v: the bytes before the cut lent", replaced)
		if replaced {
			require.ErrorIs(t, err, source.ErrChanged)
			assert.Equal(t, int(cut), n)
			require.Equal(t, old[:n], p[:n], "only bytes of the version opened")
		} else {
			require.NoError(t, err)
			require.Equal(t, old[:len(p)], p)
			assert.Equal(t, int64(2), m.count.Requests.Load(), "the attempt cut and its resume")
		}
		checkHeld(t, tree.ahead)
	}
}

// A reader whose buffer is lent gets it back only once the stream no
// longer writes into it: closing the tree mid-lend ends the read with the
// bytes that came, and the caller may reuse its buffer at once (-race sees
// any write after the read returned).
func TestAheadLendEndsBeforeItsReadReturns(t *testing.T) {
	const size, req = 4 << 20, 4 << 20
	tree, m, f := aheadTree(t, size, req, 4*req)
	m.gate = newGate()
	p := make([]byte, 2<<20)
	var n int
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		n, err = f.ReadAt(p, 0)
	}()
	waitLends(t, tree, f, 1)
	m.gate.openTo(300 << 10)
	require.Eventually(t, func() bool { return m.gate.delivered.Load() == 300<<10 }, 30*time.Second, time.Millisecond)
	tree.Close()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a reader of a lend still waits after Close")
	}
	require.Error(t, err)
	require.Equal(t, m.data[:n], p[:n])
	for i := range p {
		p[i] = 0xA5
	}
	m.gate.openTo(size) // a stream still reading would now write into p
	time.Sleep(10 * time.Millisecond)
	assert.Equal(t, byte(0xA5), p[len(p)-1])
}
