package torchzip

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readLog records the reads through it; reads at or past failAt fail.
type readLog struct {
	r      io.ReaderAt
	failAt int64
	reads  [][2]int64
}

var errRead = errors.New("disk on fire")

func (l *readLog) ReadAt(p []byte, off int64) (int, error) {
	l.reads = append(l.reads, [2]int64{off, int64(len(p))})
	if off+int64(len(p)) > l.failAt {
		return 0, errRead
	}
	return l.r.ReadAt(p, off)
}

// TestWindowed: reads inside a window are served from one read of it;
// others, and those in a window whose read failed, go to the reader as they
// are, its errors unchanged.
func TestWindowed(t *testing.T) {
	data := make([]byte, 300<<10)
	for i := range data {
		data[i] = byte(i * 13)
	}
	size := int64(len(data))
	log := &readLog{r: bytes.NewReader(data), failAt: size}
	w := Windowed(log, size)
	read := func(off, n int64) ([]byte, error) {
		p := make([]byte, n)
		_, err := w.ReadAt(p, off)
		return p, err
	}
	for _, rd := range [][2]int64{{0, 30}, {100, 512}, {size - 22, 22}, {size - 1024, 1024}, {headWindow - 10, 10}, {size - tailWindow, 5}} {
		got, err := read(rd[0], rd[1])
		require.NoError(t, err)
		assert.Equal(t, data[rd[0]:rd[0]+rd[1]], got, "read %v", rd)
	}
	assert.Equal(t, [][2]int64{{0, headWindow}, {size - tailWindow, tailWindow}}, log.reads)

	// Outside both windows, or across a window's edge: the reader's read.
	log.reads = nil
	for _, rd := range [][2]int64{{headWindow, 10}, {headWindow - 5, 10}, {size - tailWindow - 1, 2}} {
		got, err := read(rd[0], rd[1])
		require.NoError(t, err)
		assert.Equal(t, data[rd[0]:rd[0]+rd[1]], got)
	}
	assert.Len(t, log.reads, 3)

	// A small archive is one window, one read.
	log = &readLog{r: bytes.NewReader(data[:1000]), failAt: 1000}
	w = Windowed(log, 1000)
	for _, off := range []int64{978, 0, 500} {
		_, err := read(off, 22)
		require.NoError(t, err)
	}
	assert.Len(t, log.reads, 1)

	// The window's read fails: a read inside it gets that error, the
	// window not read again; a read outside both windows is the reader's.
	log = &readLog{r: bytes.NewReader(data), failAt: size - 100}
	w = Windowed(log, size)
	_, err := read(size-22, 22)
	assert.ErrorIs(t, err, errRead)
	_, err = read(size-tailWindow, 10)
	assert.ErrorIs(t, err, errRead)
	got, err := read(headWindow+1, 10)
	require.NoError(t, err)
	assert.Equal(t, data[headWindow+1:headWindow+11], got)
	assert.Len(t, log.reads, 2) // the tail window, the read outside

	// A reader shorter than the size it was given: a short window is an
	// unexpected EOF, as archive/zip words a truncated directory.
	w = Windowed(bytes.NewReader(data[:500]), 1000)
	_, err = read(978, 22)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

// TestHeld: Held hands on bytes only from a window already read, whole
// inside it, and never reads; a failed window holds nothing.
func TestHeld(t *testing.T) {
	data := make([]byte, 300<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	size := int64(len(data))
	log := &readLog{r: bytes.NewReader(data), failAt: size}
	w := Windowed(log, size)
	defer w.Release()
	assert.Nil(t, w.Held(0, 16), "the head window is not read yet")
	assert.Empty(t, log.reads)
	_, err := w.ReadAt(make([]byte, 4), 0) // reads the head window
	require.NoError(t, err)
	for _, tc := range []struct {
		off, n int64
		held   bool
	}{
		{0, 16, true},
		{0, headWindow, true},
		{headWindow - 1, 1, true},
		{headWindow - 1, 2, false}, // runs past the window
		{100, 0, true},
		{headWindow, 0, true}, // nothing, at the window's end
		{headWindow + 1, 0, false},
		{-1, 4, false},
		{8, -1, false},
		{8, 1 << 62, false},
		{size - 16, 16, false}, // the tail window, not read
	} {
		b := w.Held(tc.off, tc.n)
		if !tc.held {
			assert.Nil(t, b, "[%d, +%d)", tc.off, tc.n)
			continue
		}
		require.NotNil(t, b, "[%d, +%d)", tc.off, tc.n)
		assert.Equal(t, data[tc.off:tc.off+tc.n], b)
		assert.Equal(t, len(b), cap(b), "not to be appended to")
	}
	assert.Len(t, log.reads, 1, "Held reads nothing")

	// A tail window whose read failed holds nothing.
	log = &readLog{r: bytes.NewReader(data), failAt: size - 1}
	w2 := Windowed(log, size)
	defer w2.Release()
	_, err = w2.ReadAt(make([]byte, 4), size-8)
	require.ErrorIs(t, err, errRead)
	assert.Nil(t, w2.Held(size-8, 4))
}
