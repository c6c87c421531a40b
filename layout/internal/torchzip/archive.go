package torchzip

import (
	"archive/zip"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Archive is the directory of a torch.save archive: its one top-level
// folder and its entries by name.
type Archive struct {
	Prefix  string
	Entries map[string]*zip.File
	Files   []*zip.File // in directory order
	size    int64
}

// Open reads the directory of the torch.save archive r (size bytes): at
// least one entry, each name once, all under the first entry's top-level
// folder's name as prefix, and little-endian if it says.
func Open(r io.ReaderAt, size int64) (*Archive, error) {
	zr, err := NewReader(r, size)
	if err != nil {
		return nil, err
	}
	if len(zr.File) == 0 {
		return nil, errors.New("torch.save archive has no entries")
	}
	prefix, _, ok := strings.Cut(zr.File[0].Name, "/")
	if !ok {
		return nil, fmt.Errorf("torch.save archive entry %q has no top-level folder", zr.File[0].Name)
	}
	a := &Archive{Prefix: prefix, Entries: make(map[string]*zip.File, len(zr.File)), Files: zr.File, size: size}
	for _, e := range zr.File {
		if _, dup := a.Entries[e.Name]; dup {
			return nil, fmt.Errorf("entry %s appears twice", e.Name)
		}
		a.Entries[e.Name] = e
	}
	if bo := a.Entries[prefix+"/byteorder"]; bo != nil {
		b, err := ReadEntry(bo, 16)
		if err != nil {
			return nil, err
		}
		if string(b) != "little" {
			return nil, fmt.Errorf("byteorder %q is not supported", b)
		}
	}
	return a, nil
}

// Entry returns the entry name under the archive's folder ("data.pkl",
// "data/0").
func (a *Archive) Entry(name string) (*zip.File, error) {
	e := a.Entries[a.Prefix+"/"+name]
	if e == nil {
		return nil, fmt.Errorf("torch.save archive has no %s/%s", a.Prefix, name)
	}
	return e, nil
}

// Stored checks that e can be read in place: stored uncompressed, its size
// within the archive's.
func (a *Archive) Stored(e *zip.File) error {
	if e.Method != zip.Store {
		return fmt.Errorf("entry %s is compressed (method %d): torch.save stores records uncompressed, and only those can be read in place", e.Name, e.Method)
	}
	if e.CompressedSize64 != e.UncompressedSize64 || e.UncompressedSize64 > uint64(a.size) {
		return fmt.Errorf("entry %s: sizes %d/%d past end of file (%d bytes)", e.Name, e.CompressedSize64, e.UncompressedSize64, a.size)
	}
	return nil
}
