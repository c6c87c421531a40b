package torchzip

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// torchArchives is every torch.save archive torch wrote in testdata: whole
// files (.pt, .bin) and the chunk records of the DCP shards (.distcp), cut
// out at their end records.
func torchArchives(t testing.TB) map[string][]byte {
	out := map[string][]byte{}
	for _, root := range []string{"../../../testdata", "../../torchdcp/testdata"} {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			ext := filepath.Ext(p)
			if ext != ".pt" && ext != ".bin" && ext != ".distcp" {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if ext != ".distcp" {
				if bytes.HasPrefix(b, []byte("PK\x03\x04")) {
					out[p] = b
				}
				return nil
			}
			for i, rec := range splitRecords(b) {
				out[p+"#"+string(rune('a'+i%26))+strings.Repeat("'", i/26)] = rec
			}
			return nil
		})
		require.NoError(t, err)
	}
	return out
}

// splitRecords cuts a .distcp shard's stored records (zstd ones are no
// zip): each from a local header to the first end record after it that
// archive/zip opens the record at.
func splitRecords(b []byte) [][]byte {
	var out [][]byte
	for start := 0; start < len(b) && bytes.HasPrefix(b[start:], []byte("PK\x03\x04")); {
		end := -1
		for p := start; ; {
			i := bytes.Index(b[p:], []byte("PK\x05\x06"))
			if i < 0 || p+i+endLen > len(b) {
				break
			}
			rec := b[start : p+i+endLen]
			if _, err := zip.NewReader(bytes.NewReader(rec), int64(len(rec))); err == nil {
				end = p + i + endLen
				break
			}
			p += i + 1
		}
		if end < 0 {
			break
		}
		out = append(out, b[start:end])
		start = end
	}
	return out
}

// sameAsArchiveZip opens data with OpenRecord; where it opens, Open
// (archive/zip) must open it too, with the same entries, the same data
// offsets and the same bytes for every small entry either reads.
func sameAsArchiveZip(t *testing.T, data []byte) (*RecordArchive, error) {
	t.Helper()
	size := int64(len(data))
	w := Windowed(bytes.NewReader(data), size)
	defer w.Release()
	a, err := OpenRecord(w, size)
	if err != nil {
		return nil, err
	}
	z, zerr := Open(bytes.NewReader(data), size)
	require.NoError(t, zerr, "OpenRecord opens what archive/zip refuses")
	require.Equal(t, z.Prefix, a.Prefix)
	require.Len(t, a.entries, len(z.Files))
	for i, f := range z.Files {
		e := &a.entries[i]
		require.Equal(t, f.Name, e.Name())
		require.Equal(t, [3]uint64{uint64(f.Flags), uint64(f.Method), uint64(f.CRC32)}, [3]uint64{uint64(e.Flags), uint64(e.Method), uint64(e.CRC32)}, f.Name)
		require.Equal(t, [2]uint64{f.CompressedSize64, f.UncompressedSize64}, [2]uint64{e.Compressed, e.Uncompressed}, f.Name)
		off, err := a.DataOffset(e)
		zoff, zerr := f.DataOffset()
		if err == nil {
			require.NoError(t, zerr, f.Name)
			require.Equal(t, zoff, off, f.Name)
		}
		if f.UncompressedSize64 > 1<<20 {
			continue
		}
		b, err := a.ReadEntry(e, 1<<20)
		if err == nil {
			zb, zerr := ReadEntry(f, 1<<20)
			require.NoError(t, zerr, "%s: OpenRecord reads what archive/zip refuses", f.Name)
			require.Equal(t, zb, b, f.Name)
		}
	}
	return a, nil
}

// TestOpenRecordTorchArchives: every archive torch wrote in testdata opens
// through OpenRecord as through archive/zip, entry for entry.
func TestOpenRecordTorchArchives(t *testing.T) {
	all := torchArchives(t)
	records := 0
	for name, data := range all {
		a, err := sameAsArchiveZip(t, data)
		require.NoError(t, err, name)
		_, err = a.Entry("data.pkl")
		require.NoError(t, err, name)
		if strings.Contains(name, ".distcp#") {
			records++
		}
	}
	assert.Greater(t, records, 100, "DCP records")
	assert.Greater(t, len(all)-records, 10, "whole torch.save files")
}

// TestOpenRecordReads: a record no larger than its two windows is one read,
// whatever OpenRecord and ReadEntry look at.
func TestOpenRecordReads(t *testing.T) {
	for name, b := range torchArchives(t) {
		if len(b) > headWindow+tailWindow || !strings.Contains(name, ".distcp#") {
			continue
		}
		log := &readLog{r: bytes.NewReader(b), failAt: int64(len(b))}
		w := Windowed(log, int64(len(b)))
		a, err := OpenRecord(w, int64(len(b)))
		require.NoError(t, err)
		pkl, err := a.Entry("data.pkl")
		require.NoError(t, err)
		_, err = a.ReadEntry(pkl, 1<<20)
		require.NoError(t, err)
		w.Release()
		require.Len(t, log.reads, 1, name)
	}
}

// patch returns b with le32/le16 v written at off (from the end when off < 0).
func patch(b []byte, off int, v uint32, width int) []byte {
	b = bytes.Clone(b)
	if off < 0 {
		off += len(b)
	}
	if width == 2 {
		binary.LittleEndian.PutUint16(b[off:], uint16(v))
	} else {
		binary.LittleEndian.PutUint32(b[off:], v)
	}
	return b
}

func TestOpenRecordHostile(t *testing.T) {
	good := archiveOf(t, entry{name: "a/data.pkl", data: "pickle"}, entry{name: "a/byteorder", data: "little"}, entry{name: "a/data/0", data: "0123"})
	endAt := len(good) - endLen
	dirOff := int(binary.LittleEndian.Uint32(good[endAt+16:]))
	dirSize := int(binary.LittleEndian.Uint32(good[endAt+12:]))
	lastLen := dirLen + len("a/data/0") // the last directory header
	require.Equal(t, uint32(sigDir), binary.LittleEndian.Uint32(good[endAt-lastLen:]))
	for _, tc := range []struct {
		name string
		data []byte
		err  string
	}{
		{"empty", nil, "no end of central directory record"},
		{"no zip", []byte(strings.Repeat("x", 100)), "not a torch.save zip archive"},
		{"truncated", good[:len(good)-5], "no end of central directory record"},
		{"comment past the end", patch(good, -2, 40, 2), "comment is truncated"},
		{"directory past the end record", patch(good, endAt+12, uint32(len(good)), 4), "runs past the end record"},
		{"directory offset past the end", patch(good, endAt+16, uint32(len(good)+10), 4), "runs past the end record"},
		{"more entries than the directory holds", patch(good, endAt+10, 1000, 2), "cannot hold 1000 entries"},
		{"fewer entries than the directory holds", patch(patch(good, endAt+10, 2, 2), endAt+8, 2, 2), "bytes after the directory's 2 entries"},
		{"a directory header after the directory", patch(patch(patch(good, endAt+10, 2, 2), endAt+8, 2, 2), endAt+12, uint32(dirSize-lastLen), 4), "a directory header after the directory's 2 entries"},
		{"bad directory header", patch(good, dirOff, 0x12345678, 4), "bad directory header"},
		{"name past the directory", patch(good, dirOff+28, 5000, 2), "past the directory's end"},
		{"a zip64 locator of another disk", zip64Locator(t, good, 3, 1), "multi-disk"},
		{"a zip64 end record outside the file", zip64Locator(t, good, 0, 1<<40), "outside the"},
		{"data.pkl's CRC32", patch(good, dirOff+16, 7, 4), "data.pkl: zip: checksum error"},
		{"a local header elsewhere", patch(good, dirOff+42, 3, 4), "bad local file header"},
		{"no entries", archiveOf(t), "has no entries"},
		{"no top-level folder", archiveOf(t, entry{name: "data.pkl"}), "has no top-level folder"},
		{"an entry twice", archiveOf(t, entry{name: "a/data.pkl"}, entry{name: "a/data/0"}, entry{name: "a/data.pkl"}), "a/data.pkl appears twice"},
		{"big-endian", archiveOf(t, entry{name: "a/data.pkl"}, entry{name: "a/byteorder", data: "big"}), `byteorder "big" is not supported`},
		{"a compressed entry", archiveOf(t, entry{name: "a/data.pkl", data: "p"}, entry{name: "a/data/1", data: "zz", method: zip.Deflate}), "entry a/data/1 is compressed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := Windowed(bytes.NewReader(tc.data), int64(len(tc.data)))
			defer w.Release()
			a, err := OpenRecord(w, int64(len(tc.data)))
			if err == nil {
				var pkl *RecordEntry
				if pkl, err = a.Entry("data.pkl"); err == nil {
					_, err = a.ReadEntry(pkl, 1<<20)
				}
			}
			require.ErrorContains(t, err, tc.err)
		})
	}
	// The table's base opens, as through archive/zip.
	_, err := sameAsArchiveZip(t, good)
	require.NoError(t, err)
	_, err = sameAsArchiveZip(t, patch(good, dirOff+16, crc32.ChecksumIEEE([]byte("pickle")), 4))
	require.NoError(t, err)
}

// zip64Locator puts a zip64 locator (of disk, pointing at off) before b's
// end record, whose entry count it sets to 0xffff.
func zip64Locator(t *testing.T, b []byte, disk uint32, off uint64) []byte {
	t.Helper()
	end := bytes.Clone(b[len(b)-endLen:])
	binary.LittleEndian.PutUint16(end[10:], 0xffff)
	loc := make([]byte, loc64Len)
	binary.LittleEndian.PutUint32(loc, sigLoc64)
	binary.LittleEndian.PutUint32(loc[4:], disk)
	binary.LittleEndian.PutUint64(loc[8:], off)
	binary.LittleEndian.PutUint32(loc[16:], 1)
	return append(append(bytes.Clone(b[:len(b)-endLen]), loc...), end...)
}

// FuzzOpenRecord: whatever OpenRecord opens, archive/zip opens the same
// (entries, data offsets, the bytes of small entries); nothing crashes.
func FuzzOpenRecord(f *testing.F) {
	n := 0
	for name, b := range torchArchives(f) {
		if len(b) <= 64<<10 && (strings.Contains(name, "records") || n < 20) {
			f.Add(b)
			n++
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = sameAsArchiveZip(t, data)
	})
}

// TestOpenRecordNegativeSize: a size below zero (a forged record length) is
// an error, not a panic.
func TestOpenRecordNegativeSize(t *testing.T) {
	w := Windowed(bytes.NewReader(nil), -5)
	defer w.Release()
	_, err := OpenRecord(w, -5)
	require.ErrorContains(t, err, "archive of -5 bytes")
}
