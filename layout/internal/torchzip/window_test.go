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
