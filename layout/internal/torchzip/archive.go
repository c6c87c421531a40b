package torchzip

import (
	"archive/zip"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ckptfs/ckptfs/layout/pickle"
)

// Archive is the directory of a torch.save archive: its one top-level
// folder and its entries by name.
type Archive struct {
	Prefix  string
	Entries map[string]*zip.File
	Files   []*zip.File // in directory order
	size    int64
}

// Open is the one way into a torch.save archive, for every format: it
// reads the directory of the archive r (size bytes) and checks it, so that
// every archive meets the same hostile checks: at least one entry, each
// name once, all under the first entry's top-level folder's name as
// prefix, little-endian if it says, and every entry stored uncompressed
// inside the file, the entries together no larger than the file (so none
// can be read twice over: no overlapping or huge entries). torch.save
// writes nothing else. Decode then reads data.pkl.
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
	var c entryChecker
	for _, e := range zr.File {
		if err := c.add([]byte(e.Name), e.Method, e.CompressedSize64, e.UncompressedSize64, size, len(zr.File)); err != nil {
			return nil, err
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

// Limits bound what decoding an archive's data.pkl may read and build.
// The sets below are named by what the archive holds; every reader uses
// one of them.
type Limits struct {
	DataPkl   int64 // bytes of data.pkl
	StringLen int
	Items     int64
	Depth     int
	Stack     int
	Memo      int
}

var (
	// WholeFile is for a torch.save file of its own: a state dict (about
	// 200 bytes of data.pkl per tensor), optimizer state, a trainer's
	// common state.
	WholeFile = Limits{DataPkl: 256 << 20, StringLen: 1 << 20, Items: 1 << 24, Depth: 64, Stack: 1 << 16, Memo: 1 << 24}
	// Record is for a DCP chunk record: one tensor, one storage, read on
	// every chunk's first use; or one of a DCP checkpoint's items (a value
	// saved beside the tensors, as Composer's HF config).
	Record = Limits{DataPkl: 1 << 20, StringLen: 1 << 16, Items: 1 << 16, Depth: 32, Stack: 1 << 12, Memo: 1 << 12}
)

// Decode reads data.pkl within l and decodes it with the restricted VM
// (nothing is executed): storages become *Storage, everything else inert
// values.
func (a *Archive) Decode(l Limits) (any, error) {
	pkl, err := a.Entry("data.pkl")
	if err != nil {
		return nil, err
	}
	data, err := ReadEntry(pkl, l.DataPkl)
	if err != nil {
		return nil, err
	}
	return DecodePickle(data, l)
}

// DecodePickle decodes data, a data.pkl already read, within l.
func DecodePickle(data []byte, l Limits) (any, error) {
	v, err := pickle.DecodeBytes(data, pickle.Options{
		MaxInputBytes: l.DataPkl, MaxStringLen: l.StringLen, MaxItems: l.Items,
		MaxDepth: l.Depth, MaxStack: l.Stack, MaxMemo: l.Memo,
		PersistentLoad: PersistentLoad,
	})
	if err != nil {
		return nil, fmt.Errorf("data.pkl: %w", err)
	}
	return v, nil
}
