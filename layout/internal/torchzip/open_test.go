package torchzip

import (
	"bytes"
	"errors"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type failingReader struct{ err error }

func (r failingReader) ReadAt([]byte, int64) (int, error) { return 0, r.err }

// TestNewReaderKeepsTheCause: a source that cannot be read is reported as
// the read error, not as a file that is no zip; garbage and a truncated
// file are.
func TestNewReaderKeepsTheCause(t *testing.T) {
	refused := errors.New("read s3://b/k: s3: request failed: connect: connection refused")
	_, err := NewReader(failingReader{refused}, 4096)
	require.ErrorIs(t, err, refused)
	assert.NotContains(t, err.Error(), "not a torch.save zip archive")
	_, err = NewReader(failingReader{syscall.EIO}, 4096)
	require.ErrorIs(t, err, syscall.EIO)
	assert.NotContains(t, err.Error(), "not a torch.save zip archive")

	_, err = NewReader(bytes.NewReader(bytes.Repeat([]byte("x"), 4096)), 4096)
	assert.ErrorContains(t, err, "not a torch.save zip archive")
	_, err = NewReader(bytes.NewReader([]byte("PK")), 1<<20)
	assert.ErrorContains(t, err, "not a torch.save zip archive")
}
