package torchzip

import (
	"archive/zip"
	"errors"
	"fmt"
	"io"
)

// NewReader reads the zip directory of a torch.save archive of size bytes.
// A file that is no zip is "not a torch.save zip archive"; a read that
// failed (a refused connection, EIO) is reported as itself, not as a format
// error that would send whoever reads the log looking at the file.
// zip.ErrInsecurePath is no error here: names are checked by the callers.
func NewReader(r io.ReaderAt, size int64) (*zip.Reader, error) {
	zr, err := zip.NewReader(r, size)
	switch {
	case err == nil || errors.Is(err, zip.ErrInsecurePath):
		return zr, nil
	case errors.Is(err, zip.ErrFormat), errors.Is(err, zip.ErrAlgorithm), errors.Is(err, zip.ErrChecksum),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF): // a directory past the end: truncated
		return nil, fmt.Errorf("not a torch.save zip archive: %w", err)
	}
	return nil, fmt.Errorf("reading the zip directory: %w", err)
}
