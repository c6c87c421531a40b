package torchsave

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/sttest"
)

// readTensor reads a tensor's bytes through its chunk source.
func readTensor(t *testing.T, tn *ckpt.Tensor) []byte {
	t.Helper()
	require.Equal(t, 1, tn.Chunks.Len(), tn.Name)
	b := make([]byte, tn.ByteSize())
	n, err := tn.Chunks.At(0).Source.ReadAt(b, 0)
	if err == io.EOF && n == len(b) {
		err = nil
	}
	require.NoError(t, err, tn.Name)
	return b
}

// TestFixtures: the tensors of the transformers-written fixtures are byte for
// byte what the model's own safetensors save_pretrained holds, and nothing
// else is shown; a tied lm_head is left out as the alias it is.
func TestFixtures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		files   int
		skipped []string
	}{
		{"torchsave_llama_sharded", 12, nil},
		{"torchsave_llama_tied", 1, []string{"lm_head.weight"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join("..", "..", "testdata", tc.name)
			c, err := Open(filepath.Join(dir, "ckpt"))
			require.NoError(t, err)
			defer c.Close()
			assert.Equal(t, ckpt.FormatTorchSave, c.Format)
			want := sttest.FileTensors(t, filepath.Join(dir, "expected.safetensors"))
			got := map[string][]byte{}
			for _, tn := range c.Tensors {
				got[tn.Name] = readTensor(t, tn)
				require.NoError(t, tn.Chunks.At(0).Source.(ckpt.Verifier).Verify(), tn.Name)
			}
			require.Len(t, got, len(want))
			for name, w := range want {
				require.Contains(t, got, name)
				assert.True(t, bytes.Equal(w, got[name]), "tensor %s differs", name)
			}
			var skipped []string
			for _, s := range c.Skipped {
				skipped = append(skipped, s.Name)
				assert.Contains(t, s.Reason, "model.embed_tokens.weight")
			}
			assert.Equal(t, tc.skipped, skipped)
			if tc.files > 1 {
				assert.Len(t, c.FileIndex, len(want))
			}
			assert.True(t, Reader.Detect(c.Files.Tree()))
		})
	}
	assert.True(t, IsInternal("pytorch_model-00002-of-00012.bin"))
	assert.True(t, IsInternal(IndexFile))
	assert.False(t, IsInternal("config.json"))
}

// Pickle pieces (protocol 2, as torch.save writes).
func pstr(s string) string {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], uint32(len(s)))
	return "X" + string(b[:]) + s
}

func pint(n int64) string {
	if n >= math.MinInt32 && n <= math.MaxInt32 {
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], uint32(int32(n)))
		return "J" + string(b[:])
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(n))
	return "\x8a\x08" + string(b[:])
}

func ptuple(xs ...int64) string {
	s := "("
	for _, x := range xs {
		s += pint(x)
	}
	return s + "t"
}

// tensor is a _rebuild_tensor_v2 call on a persistent storage.
type tensor struct {
	class, key   string
	numel, off   int64
	size, stride []int64
}

func (p tensor) pkl() string {
	return "ctorch._utils\n_rebuild_tensor_v2\n(" +
		"(" + pstr("storage") + "ctorch\n" + p.class + "\n" + pstr(p.key) + pstr("cpu") + pint(p.numel) + "tQ" +
		pint(p.off) + ptuple(p.size...) + ptuple(p.stride...) + "\x89ccollections\nOrderedDict\n)RtR"
}

// dict pickles {k: v, ...} from raw pickled values.
func dict(kv ...string) []byte {
	s := "\x80\x02}("
	for _, x := range kv {
		s += x
	}
	return []byte(s + "u.")
}

type entry struct {
	name   string
	data   []byte
	method uint16
	claim  int64 // > 0: the size the directory claims
}

func zipOf(t testing.TB, ents ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := zip.NewWriter(&buf)
	for _, e := range ents {
		if e.claim > 0 {
			fh := &zip.FileHeader{Name: e.name, Method: zip.Store, CompressedSize64: uint64(e.claim), UncompressedSize64: uint64(e.claim)}
			fw, err := w.CreateRaw(fh)
			require.NoError(t, err)
			_, err = fw.Write(e.data)
			require.NoError(t, err)
			continue
		}
		fw, err := w.CreateHeader(&zip.FileHeader{Name: e.name, Method: e.method})
		require.NoError(t, err)
		_, err = fw.Write(e.data)
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
	return buf.Bytes()
}

// f32 is n float32 values 1, 2, ...
func f32(n int) []byte {
	b := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(i+1)))
	}
	return b
}

// model is a pytorch_model.bin with data.pkl pkl and float storages
// "0" (4 elements) and "1" (6 elements).
func model(t testing.TB, pkl []byte, extra ...entry) []byte {
	return zipOf(t, append([]entry{
		{name: "pytorch_model/data.pkl", data: pkl},
		{name: "pytorch_model/byteorder", data: []byte("little")},
		{name: "pytorch_model/data/0", data: f32(4)},
		{name: "pytorch_model/data/1", data: f32(6)},
		{name: "pytorch_model/version", data: []byte("3\n")},
	}, extra...)...)
}

func w0() string {
	return pstr("w") + tensor{"FloatStorage", "0", 4, 0, []int64{2, 2}, []int64{2, 1}}.pkl()
}

func openBytes(t *testing.T, files map[string][]byte) (*ckpt.Checkpoint, error) {
	t.Helper()
	dir := t.TempDir()
	for name, b := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
	}
	return Open(dir)
}

// withZip64Count rewrites an archive's end record to defer to a zip64 end
// record claiming count entries.
func withZip64Count(b []byte, count uint64) []byte {
	at := bytes.LastIndex(b, []byte("PK\x05\x06"))
	eocd := append([]byte(nil), b[at:at+22]...)
	cdSize := binary.LittleEndian.Uint32(eocd[12:])
	cdOff := binary.LittleEndian.Uint32(eocd[16:])
	out := append([]byte(nil), b[:at]...)
	z64 := len(out)
	rec := make([]byte, 56)
	binary.LittleEndian.PutUint32(rec, 0x06064b50)
	binary.LittleEndian.PutUint64(rec[4:], 44)
	binary.LittleEndian.PutUint64(rec[24:], count)
	binary.LittleEndian.PutUint64(rec[32:], count)
	binary.LittleEndian.PutUint64(rec[40:], uint64(cdSize))
	binary.LittleEndian.PutUint64(rec[48:], uint64(cdOff))
	out = append(out, rec...)
	loc := make([]byte, 20)
	binary.LittleEndian.PutUint32(loc, 0x07064b50)
	binary.LittleEndian.PutUint64(loc[8:], uint64(z64))
	binary.LittleEndian.PutUint32(loc[16:], 1)
	out = append(out, loc...)
	binary.LittleEndian.PutUint16(eocd[8:], 0xffff)
	binary.LittleEndian.PutUint16(eocd[10:], 0xffff)
	return append(out, eocd...)
}

// TestHostile: every hostile archive is an error naming the file and the
// cause, before any tensor is shown; nothing is executed.
func TestHostile(t *testing.T) {
	good := model(t, dict(w0()))
	for _, tc := range []struct {
		name string
		bin  []byte
		err  string
	}{
		{"os.system at the top", model(t, []byte("\x80\x02cos\nsystem\n"+pstr("touch /tmp/pwned")+"\x85R.")),
			"data.pkl holds os.system(...), not a state dict of tensors"},
		{"os.system as a value", model(t, dict(w0(), pstr("x"), "cos\nsystem\n"+pstr("ls")+"\x85R")),
			`data.pkl["x"] is os.system(...), not a tensor`},
		{"posix.system reducing a storage", model(t, dict(pstr("x"), "cposix\nsystem\n(("+pstr("storage")+"ctorch\nFloatStorage\n"+pstr("0")+pstr("cpu")+pint(4)+"tQtR")),
			`data.pkl["x"] is posix.system(...), not a tensor`},
		{"storage past EOF", model(t, dict(w0()), entry{name: "pytorch_model/data/9", data: f32(1), claim: 1 << 20}),
			"past end of file"},
		{"huge storage", model(t, dict(pstr("w")+tensor{"FloatStorage", "0", 1 << 40, 0, []int64{2}, []int64{1}}.pkl())),
			`storage "0" of 4398046511104 bytes, but pytorch_model/data/0 holds 16`},
		{"overlapping entries", model(t, dict(w0()), entry{name: "pytorch_model/data/7", data: f32(1), claim: int64(len(good)) - 200},
			entry{name: "pytorch_model/data/8", data: f32(1), claim: int64(len(good)) - 200}),
			"overlapping or huge entries"},
		{"compressed record", zipOf(t,
			entry{name: "pytorch_model/data.pkl", data: dict(w0())},
			entry{name: "pytorch_model/data/0", data: f32(4), method: zip.Deflate}),
			"pytorch_model/data/0 is compressed (method 8)"},
		{"zip bomb directory count", withZip64Count(good, 1<<40), "zip directory claims 1099511627776 entries"},
		{"tensor past its storage", model(t, dict(pstr("w")+tensor{"FloatStorage", "0", 4, 3, []int64{2}, []int64{1}}.pkl())),
			"bytes [12, 20) outside its storage"},
		{"missing storage", model(t, dict(pstr("w")+tensor{"FloatStorage", "5", 4, 0, []int64{2}, []int64{1}}.pkl())),
			"has no pytorch_model/data/5"},
		{"storage key disagreeing", model(t, dict(w0(), pstr("v")+tensor{"FloatStorage", "0", 3, 0, []int64{2}, []int64{1}}.pkl())),
			`storage "0" is torch.FloatStorage of 4 and torch.FloatStorage of 3`},
		{"non-str key", model(t, dict(pint(3)+tensor{"FloatStorage", "0", 4, 0, []int64{2}, []int64{1}}.pkl())),
			"key 3 is not a str"},
		{"big endian", zipOf(t, entry{name: "a/data.pkl", data: dict(w0())}, entry{name: "a/byteorder", data: []byte("big")},
			entry{name: "a/data/0", data: f32(4)}), `byteorder "big"`},
		{"not a zip", []byte("\x80\x02}q\x00."), "no end of central directory"},
		{"no data.pkl", zipOf(t, entry{name: "a/data/0", data: f32(4)}), "no a/data.pkl"},
		{"unknown dtype", model(t, dict(pstr("w")+"ctorch._utils\n_rebuild_tensor_v3\n(("+pstr("storage")+"ctorch.storage\nUntypedStorage\n"+pstr("0")+pstr("cpu")+pint(16)+"tQ"+pint(0)+ptuple(4)+ptuple(1)+"\x89ccollections\nOrderedDict\n)Rctorch\nfloat99\ntR")),
			"torch.float99 is not a torch dtype"},
		{"pickle memo bomb", model(t, []byte("\x80\x02]q\x00"+strings.Repeat("h\x00h\x00\x86q\x00", 80)+".")),
			"data.pkl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := openBytes(t, map[string][]byte{SingleFile: tc.bin})
			if err == nil {
				c.Close()
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.err)
			assert.Contains(t, err.Error(), SingleFile)
			assert.NotContains(t, err.Error(), "\n")
			assert.True(t, errors.Is(err, ckpt.ErrInvalid), err)
		})
	}
	_, err := os.Stat("/tmp/pwned")
	assert.True(t, os.IsNotExist(err))
}

// TestViews: tensors that share a storage are each their own byte range;
// an exact alias is left out, a non-contiguous view is left out with its
// reason, a v3 (UntypedStorage) tensor reads in place.
func TestViews(t *testing.T) {
	pkl := dict(
		pstr("a")+tensor{"FloatStorage", "1", 6, 0, []int64{2, 2}, []int64{2, 1}}.pkl(),    // elements 1..4
		pstr("b")+tensor{"FloatStorage", "1", 6, 2, []int64{4}, []int64{1}}.pkl(),          // 3..6, overlaps a
		pstr("tied")+tensor{"FloatStorage", "1", 6, 0, []int64{2, 2}, []int64{2, 1}}.pkl(), // a again
		pstr("t")+tensor{"FloatStorage", "1", 6, 0, []int64{2, 3}, []int64{1, 2}}.pkl(),    // transposed
		pstr("u")+"ctorch._utils\n_rebuild_tensor_v3\n(("+pstr("storage")+"ctorch.storage\nUntypedStorage\n"+pstr("0")+pstr("cpu")+pint(16)+"tQ"+
			pint(2)+ptuple(2)+ptuple(1)+"\x89ccollections\nOrderedDict\n)Rctorch\nuint16\ntR",
	)
	c, err := openBytes(t, map[string][]byte{SingleFile: model(t, pkl)})
	require.NoError(t, err)
	defer c.Close()
	got := map[string][]byte{}
	for _, tn := range c.Tensors {
		got[tn.Name] = readTensor(t, tn)
	}
	all := f32(6)
	assert.Equal(t, map[string][]byte{"a": all[0:16], "b": all[8:24], "u": f32(4)[4:8]}, got)
	require.Len(t, c.Skipped, 2)
	assert.Equal(t, "tied", c.Skipped[0].Name)
	assert.Contains(t, c.Skipped[0].Reason, "the same bytes as a")
	assert.Equal(t, "t", c.Skipped[1].Name)
	assert.Contains(t, c.Skipped[1].Reason, "not C-contiguous")
}

// TestIndex: the index and the files must agree.
func TestIndex(t *testing.T) {
	shard := model(t, dict(w0()))
	for _, tc := range []struct {
		name, index, err string
	}{
		{"ok", `{"weight_map": {"w": "pytorch_model-00001-of-00001.bin"}}`, ""},
		{"not indexed here", `{"weight_map": {"w": "pytorch_model-00001-of-00002.bin", "v": "pytorch_model-00001-of-00001.bin"}}`, "is not indexed to this file"},
		{"missing tensor", `{"weight_map": {"w": "pytorch_model-00001-of-00001.bin", "v": "pytorch_model-00001-of-00001.bin"}}`, `says tensor "v" is in`},
		{"escape", `{"weight_map": {"w": "../x.bin"}}`, "escapes"},
		{"empty", `{"weight_map": {}}`, "empty weight_map"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := openBytes(t, map[string][]byte{IndexFile: []byte(tc.index), "pytorch_model-00001-of-00001.bin": shard})
			if tc.err == "" {
				require.NoError(t, err)
				assert.Equal(t, map[string]int{"w": 1}, c.FileIndex)
				c.Close()
				return
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.err)
		})
	}
}

// TestChangedFile: a file rewritten after Open is an error, not other bytes.
func TestChangedFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, SingleFile)
	require.NoError(t, os.WriteFile(p, model(t, dict(w0())), 0o644))
	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, os.WriteFile(p, model(t, dict(w0()), entry{name: "pad", data: make([]byte, 100)}), 0o644))
	_, err = c.Tensors[0].Chunks.At(0).Source.ReadAt(make([]byte, 16), 0)
	assert.ErrorIs(t, err, ckpt.ErrSourceChanged)
}

// TestCRC: a flipped byte is caught by Verify and by a whole-tensor read.
func TestCRC(t *testing.T) {
	b := model(t, dict(w0()))
	at := bytes.Index(b, f32(4))
	b[at+5] ^= 1
	c, err := openBytes(t, map[string][]byte{SingleFile: b})
	require.NoError(t, err)
	defer c.Close()
	src := c.Tensors[0].Chunks.At(0).Source
	assert.ErrorContains(t, src.(ckpt.Verifier).Verify(), "CRC32 mismatch")
	_, err = src.ReadAt(make([]byte, 16), 0)
	assert.ErrorContains(t, err, "CRC32 mismatch")
	_, err = src.ReadAt(make([]byte, 4), 0) // a part: not checkable
	assert.NoError(t, err)
}

// TestUnindexedShardIsReported: a pytorch_model-0000N-of-0000M.bin the
// index does not name is hidden as the format's own file, so it is said in
// a warning and its tensors are listed as skipped, never dropped silently;
// one that cannot be read is said too.
func TestUnindexedShardIsReported(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS(filepath.Join("..", "..", "testdata", "torchsave_llama_sharded", "ckpt"))))
	b, err := os.ReadFile(filepath.Join(dir, IndexFile))
	require.NoError(t, err)
	var idx struct {
		Metadata  map[string]any    `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	require.NoError(t, json.Unmarshal(b, &idx))
	const dropped = "pytorch_model-00012-of-00012.bin"
	var gone []string
	for name, file := range idx.WeightMap {
		if file == dropped {
			gone = append(gone, name)
			delete(idx.WeightMap, name)
		}
	}
	require.NotEmpty(t, gone)
	b, err = json.Marshal(idx)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, IndexFile), b, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pytorch_model-00013-of-00012.bin"), []byte("junk"), 0o644))

	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	var skipped []string
	for _, s := range c.Skipped {
		skipped = append(skipped, s.Name)
		assert.Equal(t, "in "+dropped+", which "+IndexFile+" does not name", s.Reason)
	}
	assert.ElementsMatch(t, gone, skipped)
	require.Len(t, c.Warnings, 2)
	assert.Contains(t, c.Warnings[0], dropped+": not in the view")
	assert.Contains(t, c.Warnings[1], "pytorch_model-00013-of-00012.bin: not in the view")
	assert.Contains(t, c.Warnings[1], "not a torch.save zip archive")
}
