package torchdcp

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/ckptfs/ckptfs/layout/pickle"
)

// Writing records: the torch.save archive that holds one tensor chunk in a
// shard file (FORMATS.md §3.3, §3.4), the counterpart of locateRecord.
//
// The archive has stored entries whose data starts at a multiple of 64
// bytes from the archive start (padding in an "FB" extra field of 'Z'
// bytes, as torch's PyTorchStreamWriter pads), the exact CRC-32 and sizes in
// the local headers (no data descriptors: the CRC of the tensor bytes is
// patched in once they are written), a central directory, and ZIP64
// records where a size or offset does not fit 32 bits. Its data.pkl uses
// _rebuild_tensor_v2 and a typed storage for the legacy dtypes, and
// _rebuild_tensor_v3 with UntypedStorage for float8 and uint16/32/64.

// PosWriter is where records are written: it knows its position and can
// patch bytes already written (the CRC of a record's data, known only once
// the data is written).
type PosWriter interface {
	io.Writer
	// Pos is the number of bytes written so far.
	Pos() int64
	// Patch overwrites already written bytes at absolute position off.
	Patch(p []byte, off int64) error
}

// RecordWriter writes the record of one contiguous tensor chunk. The
// caller writes exactly the chunk's bytes, in C order, then calls Close.
type RecordWriter struct {
	a    *archiveWriter
	size int64 // data bytes the record holds
	n    int64 // data bytes written
	crc  uint32
}

// NewRecordWriter starts, at w's position, the record of a tensor of the
// torch dtype (Storable), elemSize bytes per element and the given shape:
// it writes the entries that precede the data.
func NewRecordWriter(w PosWriter, dtype string, elemSize int64, shape []int64) (*RecordWriter, error) {
	pkl, err := tensorPickle(dtype, elemSize, shape)
	if err != nil {
		return nil, err
	}
	numel := int64(1)
	for _, d := range shape {
		numel *= d
	}
	r := &RecordWriter{a: newArchiveWriter(w), size: numel * elemSize}
	if err := r.a.add("data.pkl", pkl); err != nil {
		return nil, err
	}
	if err := r.a.add("byteorder", []byte("little")); err != nil {
		return nil, err
	}
	// The CRC is patched in by Close.
	if err := r.a.begin("data/0", r.size, 0); err != nil {
		return nil, err
	}
	return r, nil
}

// Write writes tensor bytes.
func (r *RecordWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > r.size-r.n {
		return 0, fmt.Errorf("torchdcp: record of %d bytes: %d more written", r.size, r.n+int64(len(p))-r.size)
	}
	r.crc = crc32.Update(r.crc, crc32.IEEETable, p)
	n, err := r.a.w.Write(p)
	r.n += int64(n)
	return n, err
}

// Close fixes the data's CRC-32 and writes the rest of the record. It fails
// when fewer bytes than the chunk holds were written.
func (r *RecordWriter) Close() error {
	if r.n != r.size {
		return fmt.Errorf("torchdcp: record of %d bytes: only %d written", r.size, r.n)
	}
	if r.crc != 0 { // the local header says 0 until then
		if err := r.a.setCRC(r.crc); err != nil {
			return err
		}
	}
	if err := r.a.add("version", []byte("3\n")); err != nil {
		return err
	}
	_, err := r.a.close()
	return err
}

// tensorPickle is the data.pkl of a contiguous tensor of the given torch
// dtype and shape whose storage is archive/data/0.
func tensorPickle(dtype string, elemSize int64, shape []int64) ([]byte, error) {
	numel := int64(1)
	for _, d := range shape {
		numel *= d
	}
	class, typed := storageClasses[dtype]
	if !typed && !untypedDTypes[dtype] {
		return nil, fmt.Errorf("torchdcp: torch.%s has no storage a record can hold", dtype)
	}
	rebuild, nargs := "_rebuild_tensor_v2", 6
	if !typed {
		rebuild, nargs = "_rebuild_tensor_v3", 7
	}
	e := pickle.NewEncoder()
	e.Call("torch._utils", rebuild, nargs, func() {
		// ('storage', class, key, location, numel): numel in elements for a
		// typed storage, in bytes for an untyped one.
		e.PersistentID(5, func() {
			e.Str("storage")
			if typed {
				e.Global("torch", class)
			} else {
				e.Global("torch.storage", "UntypedStorage")
			}
			e.Str("0")
			e.Str("cpu")
			if typed {
				e.Int(numel)
			} else {
				e.Int(numel * elemSize)
			}
		})
		e.Int(0) // storage_offset
		e.IntTuple(shape)
		e.IntTuple(contiguousStrides(shape))
		e.Bool(false) // requires_grad
		e.Call("collections", "OrderedDict", 0, nil)
		if !typed {
			e.Global("torch", dtype)
		}
	})
	return e.Bytes(), nil
}

// contiguousStrides are torch's C-contiguous strides: a dimension of size 0
// or 1 counts as 1 for the strides of the dimensions before it.
func contiguousStrides(shape []int64) []int64 {
	s := make([]int64, len(shape))
	st := int64(1)
	for d := len(shape) - 1; d >= 0; d-- {
		s[d] = st
		st *= max(shape[d], 1)
	}
	return s
}

const (
	archiveAlign = 64
	// archivePrefix is the top-level folder torch.save uses for a stream.
	archivePrefix = "archive/"
)

// zip64Limit is the first value that does not fit a 32-bit zip field (a
// variable so tests can force ZIP64 records on small archives).
var zip64Limit int64 = 0xFFFFFFFF

type zipEntry struct {
	name      string
	crc       uint32
	size      int64
	localOff  int64 // relative to the archive start
	crcPatch  int64 // absolute position of the local header's CRC field
	zip64Size bool  // local header carries a ZIP64 sizes field
}

// archiveWriter writes one archive to w, starting at w.Pos().
type archiveWriter struct {
	w       PosWriter
	start   int64
	entries []zipEntry
}

func newArchiveWriter(w PosWriter) *archiveWriter {
	return &archiveWriter{w: w, start: w.Pos()}
}

func (a *archiveWriter) pos() int64 { return a.w.Pos() - a.start }

// add writes a whole small entry.
func (a *archiveWriter) add(name string, data []byte) error {
	if err := a.begin(name, int64(len(data)), crc32.ChecksumIEEE(data)); err != nil {
		return err
	}
	_, err := a.w.Write(data)
	return err
}

// begin writes the local header of an entry of size bytes whose data the
// caller writes next. A crc of 0 may be fixed later with setCRC.
func (a *archiveWriter) begin(name string, size int64, crc uint32) error {
	name = archivePrefix + name
	off := a.pos()
	z64 := size >= zip64Limit
	var extra []byte
	if z64 {
		extra = binary.LittleEndian.AppendUint16(extra, 0x0001)
		extra = binary.LittleEndian.AppendUint16(extra, 16)
		extra = binary.LittleEndian.AppendUint64(extra, uint64(size))
		extra = binary.LittleEndian.AppendUint64(extra, uint64(size))
	}
	// Pad so that the data starts at a multiple of archiveAlign: the "FB"
	// field is always present, as torch writes it.
	dataAt := off + 30 + int64(len(name)) + int64(len(extra)) + 4
	pad := (archiveAlign - dataAt%archiveAlign) % archiveAlign
	extra = binary.LittleEndian.AppendUint16(extra, 0x4246) // "FB"
	extra = binary.LittleEndian.AppendUint16(extra, uint16(pad))
	for i := int64(0); i < pad; i++ {
		extra = append(extra, 'Z')
	}
	size32 := uint32(size)
	if z64 {
		size32 = 0xFFFFFFFF
	}
	h := make([]byte, 0, 30+len(name)+len(extra))
	h = binary.LittleEndian.AppendUint32(h, 0x04034b50)
	h = binary.LittleEndian.AppendUint16(h, zipVersion(z64))
	h = binary.LittleEndian.AppendUint16(h, 0) // flags
	h = binary.LittleEndian.AppendUint16(h, 0) // stored
	h = binary.LittleEndian.AppendUint16(h, 0) // time
	h = binary.LittleEndian.AppendUint16(h, 0) // date
	h = binary.LittleEndian.AppendUint32(h, crc)
	h = binary.LittleEndian.AppendUint32(h, size32)
	h = binary.LittleEndian.AppendUint32(h, size32)
	h = binary.LittleEndian.AppendUint16(h, uint16(len(name)))
	h = binary.LittleEndian.AppendUint16(h, uint16(len(extra)))
	h = append(h, name...)
	h = append(h, extra...)
	e := zipEntry{name: name, crc: crc, size: size, localOff: off, crcPatch: a.w.Pos() + 14, zip64Size: z64}
	if _, err := a.w.Write(h); err != nil {
		return err
	}
	a.entries = append(a.entries, e)
	return nil
}

// setCRC fixes the CRC of the last entry begun, once its data is written.
func (a *archiveWriter) setCRC(crc uint32) error {
	e := &a.entries[len(a.entries)-1]
	e.crc = crc
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], crc)
	return a.w.Patch(b[:], e.crcPatch)
}

// field32 is v as a 32-bit zip field: 0xFFFFFFFF when it needs ZIP64.
func field32(v int64) uint32 {
	if v >= zip64Limit {
		return 0xFFFFFFFF
	}
	return uint32(v)
}

func zipVersion(z64 bool) uint16 {
	if z64 {
		return 45
	}
	return 20
}

// close writes the central directory and the end records. It returns the
// archive length.
func (a *archiveWriter) close() (int64, error) {
	cdStart := a.pos()
	var cd []byte
	for _, e := range a.entries {
		var z64 []byte
		size32, off32 := uint32(e.size), uint32(e.localOff)
		if e.size >= zip64Limit {
			size32 = 0xFFFFFFFF
			z64 = binary.LittleEndian.AppendUint64(z64, uint64(e.size))
			z64 = binary.LittleEndian.AppendUint64(z64, uint64(e.size))
		}
		if e.localOff >= zip64Limit {
			off32 = 0xFFFFFFFF
			z64 = binary.LittleEndian.AppendUint64(z64, uint64(e.localOff))
		}
		var extra []byte
		if z64 != nil {
			extra = binary.LittleEndian.AppendUint16(extra, 0x0001)
			extra = binary.LittleEndian.AppendUint16(extra, uint16(len(z64)))
			extra = append(extra, z64...)
		}
		cd = binary.LittleEndian.AppendUint32(cd, 0x02014b50)
		cd = binary.LittleEndian.AppendUint16(cd, zipVersion(z64 != nil)) // made by
		cd = binary.LittleEndian.AppendUint16(cd, zipVersion(z64 != nil)) // needed
		cd = binary.LittleEndian.AppendUint16(cd, 0)                      // flags
		cd = binary.LittleEndian.AppendUint16(cd, 0)                      // stored
		cd = binary.LittleEndian.AppendUint16(cd, 0)                      // time
		cd = binary.LittleEndian.AppendUint16(cd, 0)                      // date
		cd = binary.LittleEndian.AppendUint32(cd, e.crc)
		cd = binary.LittleEndian.AppendUint32(cd, size32)
		cd = binary.LittleEndian.AppendUint32(cd, size32)
		cd = binary.LittleEndian.AppendUint16(cd, uint16(len(e.name)))
		cd = binary.LittleEndian.AppendUint16(cd, uint16(len(extra)))
		cd = binary.LittleEndian.AppendUint16(cd, 0) // comment
		cd = binary.LittleEndian.AppendUint16(cd, 0) // disk
		cd = binary.LittleEndian.AppendUint16(cd, 0) // internal attrs
		cd = binary.LittleEndian.AppendUint32(cd, 0) // external attrs
		cd = binary.LittleEndian.AppendUint32(cd, off32)
		cd = append(cd, e.name...)
		cd = append(cd, extra...)
	}
	cdSize := int64(len(cd))
	n := int64(len(a.entries))
	if cdStart >= zip64Limit || cdSize >= zip64Limit || n >= 0xFFFF {
		z64eocd := cdStart + cdSize
		cd = binary.LittleEndian.AppendUint32(cd, 0x06064b50)
		cd = binary.LittleEndian.AppendUint64(cd, 44) // size of the rest
		cd = binary.LittleEndian.AppendUint16(cd, 45)
		cd = binary.LittleEndian.AppendUint16(cd, 45)
		cd = binary.LittleEndian.AppendUint32(cd, 0) // this disk
		cd = binary.LittleEndian.AppendUint32(cd, 0) // cd disk
		cd = binary.LittleEndian.AppendUint64(cd, uint64(n))
		cd = binary.LittleEndian.AppendUint64(cd, uint64(n))
		cd = binary.LittleEndian.AppendUint64(cd, uint64(cdSize))
		cd = binary.LittleEndian.AppendUint64(cd, uint64(cdStart))
		cd = binary.LittleEndian.AppendUint32(cd, 0x07064b50) // locator
		cd = binary.LittleEndian.AppendUint32(cd, 0)
		cd = binary.LittleEndian.AppendUint64(cd, uint64(z64eocd))
		cd = binary.LittleEndian.AppendUint32(cd, 1) // total disks
	}
	cd = binary.LittleEndian.AppendUint32(cd, 0x06054b50)
	cd = binary.LittleEndian.AppendUint16(cd, 0)
	cd = binary.LittleEndian.AppendUint16(cd, 0)
	cd = binary.LittleEndian.AppendUint16(cd, uint16(min(n, 0xFFFF)))
	cd = binary.LittleEndian.AppendUint16(cd, uint16(min(n, 0xFFFF)))
	cd = binary.LittleEndian.AppendUint32(cd, field32(cdSize))
	cd = binary.LittleEndian.AppendUint32(cd, field32(cdStart))
	cd = binary.LittleEndian.AppendUint16(cd, 0) // comment
	if _, err := a.w.Write(cd); err != nil {
		return 0, err
	}
	return a.pos(), nil
}
