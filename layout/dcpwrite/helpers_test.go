package dcpwrite

import (
	"archive/zip"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/writetest"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/sttest"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/pickle"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/safetensors"
)

// spec is one tensor of a test safetensors file.
type spec struct {
	name  string
	dtype safetensors.DType
	shape []int64
}

func (s spec) st() sttest.Spec { return sttest.Spec{Name: s.name, DType: s.dtype, Shape: s.shape} }

// stFile is a safetensors file built in memory.
type stFile struct {
	data   []byte
	header *safetensors.Header
	// raw maps tensor name → its bytes.
	raw map[string][]byte
}

func (f *stFile) reader() io.ReaderAt { return bytes.NewReader(f.data) }

// fill returns n deterministic bytes for a tensor: varied, and for BOOL only
// 0 and 1.
func fill(name string, dtype safetensors.DType, n int64, seed int) []byte {
	b := make([]byte, n)
	h := seed
	for _, c := range name {
		h = h*31 + int(c)
	}
	for i := range b {
		v := byte((int64(h) + int64(i)*7 + int64(i)/5) & 0xff)
		if dtype == safetensors.BOOL {
			v &= 1
		}
		b[i] = v
	}
	return b
}

// makeST writes a safetensors file holding specs and parses its header
// back.
func makeST(t testing.TB, seed int, specs ...spec) *stFile {
	t.Helper()
	data, raw := sttest.Build(t, nil, func(ti safetensors.TensorInfo) []byte {
		return fill(ti.Name, ti.DType, ti.Size(), seed)
	}, sttests(specs)...)
	h, err := safetensors.ReadHeader(bytes.NewReader(data), int64(len(data)))
	require.NoError(t, err)
	return &stFile{data: data, header: h, raw: raw}
}

func sttests(specs []spec) []sttest.Spec {
	out := make([]sttest.Spec, len(specs))
	for i, s := range specs {
		out[i] = s.st()
	}
	return out
}

// boxBytes extracts a box from a C-order tensor naively, element by element.
func boxBytes(full []byte, shape, offsets, sizes []int64, es int64) []byte {
	n, _ := ckpt.NumElements(sizes)
	out := make([]byte, 0, n*es)
	if n == 0 {
		return out
	}
	idx := make([]int64, len(sizes))
	for {
		var flat int64
		for d := range shape {
			flat = flat*shape[d] + offsets[d] + idx[d]
		}
		out = append(out, full[flat*es:(flat+1)*es]...)
		d := len(sizes) - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < sizes[d] {
				break
			}
			idx[d] = 0
		}
		if d < 0 {
			return out
		}
	}
}

// expectation is what a committed tensor must read back as.
type expectation struct {
	FQN   string       `json:"fqn"`
	Path  []any        `json:"path"`
	DType string       `json:"dtype"` // torch name
	Shape []int64      `json:"shape"`
	Hex   string       `json:"hex"`
	Boxes [][2][]int64 `json:"boxes"`

	st  safetensors.DType
	raw []byte
}

func expect(target Target, f *stFile) []expectation {
	var out []expectation
	for _, ti := range f.header.Tensors {
		e := expectation{
			FQN: target.FQN(ti.Name), Path: target.plannerPath(ti.Name), DType: ti.DType.Torch(),
			Shape: ti.Shape, Hex: hex.EncodeToString(f.raw[ti.Name]), st: ti.DType, raw: f.raw[ti.Name],
		}
		for _, c := range dedupEmpty(target.Chunks(ti.Name, ti.Shape)) {
			e.Boxes = append(e.Boxes, [2][]int64{c.Offsets, c.Sizes})
		}
		out = append(out, e)
	}
	return out
}

// verifyDir opens dir with the torchdcp reader and checks that every
// expected tensor reads back byte-identical, chunk by chunk, and that every
// record is a well-formed aligned archive. It also writes expect.json for
// check_load.py.
func verifyDir(t *testing.T, dir string, exps []expectation) {
	t.Helper()
	c, err := treetest.OpenLocal(dir, torchdcp.Reader.Open)
	require.NoError(t, err)
	defer c.Close()
	for _, s := range c.Skipped {
		for _, e := range exps {
			require.NotEqual(t, e.FQN, s.Name, "skipped: %s", s.Reason)
		}
	}
	byName := map[string]*ckpt.Tensor{}
	for _, tt := range c.Tensors {
		byName[tt.Name] = tt
	}
	for _, e := range exps {
		tt := byName[e.FQN]
		require.NotNil(t, tt, "tensor %q missing", e.FQN)
		require.Equal(t, e.st, tt.DType, e.FQN)
		require.Equal(t, e.Shape, tt.Shape, e.FQN)
		require.NoError(t, tt.Validate())
		require.Equal(t, len(e.Boxes), tt.Chunks.Len(), e.FQN)
		for i, ch := range tt.Chunks.All() {
			require.Equal(t, e.Boxes[i][0], ch.Offsets, "%s chunk %d", e.FQN, i)
			require.Equal(t, e.Boxes[i][1], ch.Sizes, "%s chunk %d", e.FQN, i)
			want := boxBytes(e.raw, e.Shape, ch.Offsets, ch.Sizes, int64(e.st.Size()))
			got := make([]byte, len(want))
			if len(want) > 0 {
				_, err := ch.Source.ReadAt(got, 0)
				require.NoError(t, err, "%s chunk %d", e.FQN, i)
			}
			require.Equal(t, want, got, "%s chunk %d bytes", e.FQN, i)
		}
		if e.Path != nil {
			want := make([]string, len(e.Path))
			for i, p := range e.Path {
				want[i] = p.(string)
			}
			require.Equal(t, want, tt.Path, e.FQN)
		}
	}
	fqns := map[string]bool{}
	for _, e := range exps {
		fqns[e.FQN] = true
	}
	checkRecords(t, dir, fqns)
	writeExpect(t, dir, exps, nil)
}

// checkRecords parses every storage item of dir's .metadata as a zip with
// archive/zip: entry names and order, stored, 64-byte aligned data, CRCs
// (archive/zip checks them at EOF), and a data.pkl that decodes to a
// _rebuild_tensor call on storage "0".
func checkRecords(t *testing.T, dir string, fqns map[string]bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ".metadata"))
	require.NoError(t, err)
	m, err := torchdcp.DecodeMetadata(bytes.NewReader(b))
	require.NoError(t, err)
	for _, s := range m.Storage {
		if !fqns[s.Index.FQN] {
			continue
		}
		f, err := os.Open(filepath.Join(dir, s.Info.RelativePath))
		require.NoError(t, err)
		zr, err := zip.NewReader(io.NewSectionReader(f, s.Info.Offset, s.Info.Length), s.Info.Length)
		require.NoError(t, err, "%s", s.Index)
		var names []string
		for _, zf := range zr.File {
			names = append(names, zf.Name)
			require.Equal(t, zip.Store, zf.Method)
			off, err := zf.DataOffset()
			require.NoError(t, err)
			require.Zero(t, off%64, "%s %s data at %d", s.Index, zf.Name, off)
			rc, err := zf.Open()
			require.NoError(t, err)
			data, err := io.ReadAll(rc)
			require.NoError(t, err, "%s %s", s.Index, zf.Name)
			rc.Close()
			switch zf.Name {
			case "archive/data.pkl":
				v, err := pickle.DecodeBytes(data, pickle.Options{PersistentLoad: func(pid any) (any, error) {
					tp := pid.(pickle.Tuple)
					require.Equal(t, "storage", tp[0])
					require.Equal(t, "0", tp[2])
					return pid, nil
				}})
				require.NoError(t, err)
				obj := v.(*pickle.Object)
				require.Equal(t, "torch._utils", obj.Class.Module)
			case "archive/version":
				require.Equal(t, "3\n", string(data))
			case "archive/byteorder":
				require.Equal(t, "little", string(data))
			}
		}
		f.Close()
		require.Equal(t, []string{"archive/data.pkl", "archive/byteorder", "archive/data/0", "archive/version"}, names)
	}
}

// shardFiles lists the __*.distcp files of dir.
func shardFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		if _, _, ok := torchdcp.ParseShardName(e.Name()); ok {
			out = append(out, e.Name())
		}
	}
	return out
}

// writeExpect writes DIR.expect.json for check_load.py: the tensors, and
// paths that must exist in dcp_to_torch_save's output.
func writeExpect(t *testing.T, dir string, exps []expectation, present [][]any) {
	t.Helper()
	b, err := json.MarshalIndent(map[string]any{"tensors": exps, "present": present}, "", " ")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Clean(dir)+".expect.json", b, 0o644))
}

// scenario writes one checkpoint into dir and returns what it must hold.
type scenario struct {
	name string
	run  func(t *testing.T, dir string) []expectation
}

var scenarios = []scenario{
	{"dtypes", func(t *testing.T, dir string) []expectation {
		var a, b []spec
		for i, d := range torchDTypes() {
			s := spec{"t_" + strings.ToLower(string(d)), d, []int64{5, 2}}
			if i%2 == 0 {
				a = append(a, s)
			} else {
				b = append(b, s)
			}
		}
		a = append(a, spec{"scalar", safetensors.F32, nil})
		return commitAll(t, dir, Target{WorldSize: 3}, makeST(t, 1, a...), makeST(t, 2, b...))
	}},
	{"uneven3", uneven(3)},
	{"uneven4", uneven(4)},
	{"prefix", func(t *testing.T, dir string) []expectation {
		target := Target{WorldSize: 2, Prefix: "model", Rules: mustRules(t, "^embed 1\n")}
		return commitAll(t, dir, target,
			makeST(t, 3, spec{"layers.0.weight", safetensors.F32, []int64{4, 3}}, spec{"layers.0.bias", safetensors.BF16, []int64{4}}),
			makeST(t, 4, spec{"embed", safetensors.F16, []int64{7, 5}}))
	}},
	{"like", func(t *testing.T, dir string) []expectation {
		src := filepath.Join(dir, "..", "like-src")
		commitAll(t, src, Target{WorldSize: 4, Rules: mustRules(t, "^a 1\n")},
			makeST(t, 5, spec{"a", safetensors.F32, []int64{3, 8}}, spec{"b", safetensors.I64, []int64{6}}))
		like, err := treetest.OpenLocal(src, torchdcp.Reader.Open)
		require.NoError(t, err)
		defer like.Close()
		return commitAll(t, dir, Target{WorldSize: 2, Like: like},
			makeST(t, 6, spec{"a", safetensors.F32, []int64{3, 8}}, spec{"b", safetensors.I64, []int64{6}},
				spec{"c", safetensors.F32, []int64{5}}, spec{"d", safetensors.F32, []int64{2, 2}}))
	}},
	{"batching", func(t *testing.T, dir string) []expectation {
		defer func(n int) { copyBufSize = n }(copyBufSize)
		copyBufSize = 10
		target := Target{WorldSize: 3, Rules: mustRules(t, "^m 1\n^t3a 1\n^t3b 2\n")}
		return commitAll(t, dir, target, makeST(t, 7,
			spec{"m", safetensors.I32, []int64{6, 7}}, spec{"t3a", safetensors.U8, []int64{4, 5, 6}},
			spec{"t3b", safetensors.I16, []int64{4, 3, 5}}, spec{"big", safetensors.F64, []int64{4, 3}}))
	}},
}

func uneven(world int) func(t *testing.T, dir string) []expectation {
	return func(t *testing.T, dir string) []expectation {
		target := Target{WorldSize: world, Rules: mustRules(t, "# test plan\n^col\\. 1\n^rep\\. replicate\n^nodim 3\n")}
		return commitAll(t, dir, target, makeST(t, 9,
			spec{"d5", safetensors.F32, []int64{5, 3}}, spec{"d2", safetensors.BF16, []int64{2, 3}},
			spec{"d1", safetensors.I8, []int64{1}}, spec{"d0", safetensors.F32, []int64{0, 4}},
			spec{"d40", safetensors.F32, []int64{4, 0}}, spec{"scalar", safetensors.I64, []int64{}},
			spec{"col.w", safetensors.F16, []int64{3, 5}}, spec{"col.b", safetensors.F16, []int64{2}},
			spec{"rep.w", safetensors.F32, []int64{4, 4}}, spec{"nodim", safetensors.F32, []int64{2, 2}}))
	}
}

// openDir opens the DCP directory path (creating it, not its parents, if
// missing) for writing.
func openDir(path string, target Target, limits *Limits) (*Dir, error) {
	root, err := writetest.MakeDir(path)
	if err != nil {
		return nil, err
	}
	return Open(root, target, limits)
}
