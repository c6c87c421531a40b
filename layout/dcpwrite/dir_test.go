package dcpwrite

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/pickle"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/safetensors"
)

// torchDTypes are the safetensors dtypes with a torch equivalent.
func torchDTypes() []safetensors.DType {
	var out []safetensors.DType
	for _, d := range []safetensors.DType{
		safetensors.BOOL, safetensors.U8, safetensors.I8, safetensors.I16, safetensors.U16,
		safetensors.F16, safetensors.BF16, safetensors.I32, safetensors.U32, safetensors.F32,
		safetensors.C64, safetensors.F64, safetensors.I64, safetensors.U64,
		safetensors.F8_E5M2, safetensors.F8_E4M3, safetensors.F8_E8M0,
		safetensors.F8_E4M3FNUZ, safetensors.F8_E5M2FNUZ,
		safetensors.F4, safetensors.F6_E2M3, safetensors.F6_E3M2,
	} {
		if d.Torch() != "" {
			out = append(out, d)
		}
	}
	return out
}

func mustRules(t testing.TB, plan string) []Rule {
	t.Helper()
	r, err := ParseRules(strings.NewReader(plan))
	require.NoError(t, err)
	return r
}

// commitAll opens dir with target, commits each file, and returns the
// expectations.
func commitAll(t *testing.T, dir string, target Target, files ...*stFile) []expectation {
	t.Helper()
	d, err := openDir(dir, target, nil)
	require.NoError(t, err)
	var exps []expectation
	for _, f := range files {
		require.NoError(t, d.Commit(f.reader(), f.header))
		exps = append(exps, expect(target, f)...)
	}
	return exps
}

func TestRoundTrip(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), sc.name)
			exps := sc.run(t, dir)
			verifyDir(t, dir, exps)
			// Reopening sees the same committed state.
			d, err := openDir(dir, Target{}, nil)
			require.NoError(t, err)
			var names []string
			for _, e := range exps {
				names = append(names, e.FQN)
			}
			assert.Equal(t, names, d.Committed())
			assert.Empty(t, d.removed)
		})
	}
}

func TestUnevenLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "u")
	uneven(4)(t, dir)
	m := decodeDir(t, dir)
	boxes := map[string][]torchdcp.ChunkMetadata{}
	for _, it := range m.Items {
		boxes[it.FQN] = it.Tensor.Chunks
	}
	c := func(o, s []int64) torchdcp.ChunkMetadata { return torchdcp.ChunkMetadata{Offsets: o, Sizes: s} }
	// FORMATS.md §5.2: FSDP2 layouts observed with 4 ranks.
	assert.Equal(t, []torchdcp.ChunkMetadata{
		c([]int64{0, 0}, []int64{2, 3}), c([]int64{2, 0}, []int64{2, 3}), c([]int64{4, 0}, []int64{1, 3}), c([]int64{5, 0}, []int64{0, 3}),
	}, boxes["d5"])
	assert.Equal(t, []torchdcp.ChunkMetadata{
		c([]int64{0, 0}, []int64{1, 3}), c([]int64{1, 0}, []int64{1, 3}), c([]int64{2, 0}, []int64{0, 3}),
	}, boxes["d2"])
	assert.Equal(t, []torchdcp.ChunkMetadata{c([]int64{0}, []int64{1}), c([]int64{1}, []int64{0})}, boxes["d1"])
	assert.Equal(t, []torchdcp.ChunkMetadata{c([]int64{0, 0}, []int64{0, 4})}, boxes["d0"])
	assert.Equal(t, []torchdcp.ChunkMetadata{c([]int64{}, []int64{})}, boxes["scalar"])
	assert.Equal(t, []torchdcp.ChunkMetadata{c([]int64{0, 0}, []int64{4, 4})}, boxes["rep.w"])
	assert.Equal(t, []torchdcp.ChunkMetadata{c([]int64{0, 0}, []int64{2, 2})}, boxes["nodim"])
	assert.Equal(t, []torchdcp.ChunkMetadata{
		c([]int64{0, 0}, []int64{3, 2}), c([]int64{0, 2}, []int64{3, 2}), c([]int64{0, 4}, []int64{3, 1}), c([]int64{0, 5}, []int64{3, 0}),
	}, boxes["col.w"])
	// Files: one per rank with data, all numbered 0.
	assert.Equal(t, []string{"__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"}, shardFiles(t, dir))
}

func TestFileNumbering(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "n")
	d, err := openDir(dir, Target{WorldSize: 2, Rules: mustRules(t, "^r replicate")}, nil)
	require.NoError(t, err)
	for i, f := range []*stFile{
		makeST(t, 1, spec{"a", safetensors.F32, []int64{4}}),
		makeST(t, 2, spec{"r", safetensors.F32, []int64{4}}), // rank 0 only
		makeST(t, 3, spec{"b", safetensors.F32, []int64{4}}),
	} {
		require.NoError(t, d.Commit(f.reader(), f.header), "commit %d", i)
	}
	assert.Equal(t, []string{"__0_0.distcp", "__0_1.distcp", "__0_2.distcp", "__1_0.distcp", "__1_2.distcp"}, shardFiles(t, dir))
	// A reopened Dir continues after the highest number.
	d, err = openDir(dir, Target{WorldSize: 2}, nil)
	require.NoError(t, err)
	f := makeST(t, 4, spec{"c", safetensors.F32, []int64{4}})
	require.NoError(t, d.Commit(f.reader(), f.header))
	assert.Contains(t, shardFiles(t, dir), "__1_3.distcp")
	assert.Equal(t, []string{"a", "r", "b", "c"}, d.Committed())
}

func decodeDir(t *testing.T, dir string) *torchdcp.Metadata {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ".metadata"))
	require.NoError(t, err)
	m, err := torchdcp.DecodeMetadata(bytes.NewReader(b))
	require.NoError(t, err)
	return m
}

// snapshot is the content of every file in dir.
func snapshot(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		out[e.Name()] = b
	}
	return out
}

// failingFile fails every write once budget bytes have been written (the
// budget may be shared by files written at once).
type failingFile struct {
	*os.File
	budget *int64
	err    error
}

var budgetMu sync.Mutex

func (f failingFile) Write(p []byte) (int, error) {
	budgetMu.Lock()
	if int64(len(p)) > *f.budget {
		b := *f.budget
		*f.budget = 0
		budgetMu.Unlock()
		n, _ := f.File.Write(p[:b])
		return n, f.err
	}
	*f.budget -= int64(len(p))
	budgetMu.Unlock()
	return f.File.Write(p)
}

func TestCommitFailureLeavesOldState(t *testing.T) {
	first := makeST(t, 1, spec{"a", safetensors.F32, []int64{5, 3}}, spec{"b", safetensors.I32, []int64{2}})
	second := makeST(t, 2, spec{"c", safetensors.F32, []int64{7, 3}}, spec{"d", safetensors.U16, []int64{9}})
	target := Target{WorldSize: 3}

	injected := errors.New("injected")
	for _, tc := range []struct {
		name  string
		setup func(d *Dir)
		is    error
	}{
		{"before metadata", func(d *Dir) { d.beforeMetadata = func() error { return injected } }, injected},
		{"disk full in shard", func(d *Dir) {
			budget := int64(700)
			d.create = func(p string, excl bool) (outFile, error) {
				f, err := d.createFile(p, excl)
				if err != nil {
					return nil, err
				}
				return failingFile{f.(*os.File), &budget, syscall.ENOSPC}, nil
			}
		}, syscall.ENOSPC},
		{"disk full in metadata", func(d *Dir) {
			d.create = func(p string, excl bool) (outFile, error) {
				f, err := d.createFile(p, excl)
				if err != nil || !strings.HasSuffix(p, torchdcp.MetadataTmp) {
					return f, err
				}
				budget := int64(100)
				return failingFile{f.(*os.File), &budget, syscall.ENOSPC}, nil
			}
		}, syscall.ENOSPC},
		{"create fails", func(d *Dir) {
			var n atomic.Int32
			d.create = func(p string, excl bool) (outFile, error) {
				if n.Add(1) == 2 {
					return nil, &os.PathError{Op: "open", Path: p, Err: syscall.EIO}
				}
				return d.createFile(p, excl)
			}
		}, syscall.EIO},
		{"short source", func(d *Dir) {}, errShortSource},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "c")
			exps := commitAll(t, dir, target, first)
			before := snapshot(t, dir)
			d, err := openDir(dir, target, nil)
			require.NoError(t, err)
			tc.setup(d)
			src := second.reader()
			if tc.is == errShortSource {
				src = bytes.NewReader(second.data[:len(second.data)-5])
			}
			err = d.Commit(src, second.header)
			require.ErrorIs(t, err, tc.is)
			assert.Equal(t, before, snapshot(t, dir), "directory changed by a failed commit")
			assert.Equal(t, []string{"a", "b"}, d.Committed())
			verifyDir(t, dir, exps)

			// The Dir is still usable, and the retry reuses the file number.
			d.beforeMetadata, d.create = nil, d.createFile
			require.NoError(t, d.Commit(second.reader(), second.header))
			verifyDir(t, dir, append(exps, expect(target, second)...))
			assert.Contains(t, shardFiles(t, dir), "__0_1.distcp")
		})
	}
}

func TestOpenDirCleansStaleFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "k")
	first := makeST(t, 1, spec{"a", safetensors.F32, []int64{5, 3}})
	exps := commitAll(t, dir, Target{WorldSize: 2}, first)
	keep := snapshot(t, dir)
	// A writer killed mid-commit: partial shards of commit 1 and a
	// half-written .metadata.tmp; an unrelated file stays.
	for name, content := range map[string]string{
		"__0_1.distcp":  "PK\x03\x04partial",
		"__5_1.distcp":  "",
		".metadata.tmp": "\x80\x02garbage",
		"config.json":   "{}",
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	d, err := openDir(dir, Target{WorldSize: 2}, nil)
	require.NoError(t, err)
	sort.Strings(d.removed)
	assert.Equal(t, []string{".metadata.tmp", "__0_1.distcp", "__5_1.distcp"}, d.removed)
	now := snapshot(t, dir)
	delete(now, "config.json")
	assert.Equal(t, keep, now)
	verifyDir(t, dir, exps)
	second := makeST(t, 2, spec{"b", safetensors.F32, []int64{4}})
	require.NoError(t, d.Commit(second.reader(), second.header))
	verifyDir(t, dir, append(exps, expect(Target{WorldSize: 2}, second)...))

	// A killed first commit: no .metadata at all.
	dir2 := filepath.Join(t.TempDir(), "k2")
	require.NoError(t, os.Mkdir(dir2, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir2, "__0_0.distcp"), []byte("x"), 0o644))
	d2, err := openDir(dir2, Target{}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"__0_0.distcp"}, d2.removed)
	assert.Empty(t, d2.Committed())
}

func TestDuplicateAndBadDType(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dup")
	target := Target{WorldSize: 2, Prefix: "model"}
	first := makeST(t, 1, spec{"a", safetensors.F32, []int64{5, 3}})
	exps := commitAll(t, dir, target, first)
	before := snapshot(t, dir)
	d, err := openDir(dir, target, nil)
	require.NoError(t, err)

	dup := makeST(t, 2, spec{"b", safetensors.F32, []int64{2}}, spec{"a", safetensors.F32, []int64{1}})
	err = d.Commit(dup.reader(), dup.header)
	require.ErrorIs(t, err, ErrExists)
	assert.Contains(t, err.Error(), `"model.a"`)

	bad := makeST(t, 3, spec{"c", safetensors.F32, []int64{2}}, spec{"f4", safetensors.F4, []int64{4}})
	err = d.Commit(bad.reader(), bad.header)
	require.ErrorIs(t, err, ErrDType)
	assert.Contains(t, err.Error(), "F4")

	assert.Equal(t, before, snapshot(t, dir))
	assert.Equal(t, []string{"model.a"}, d.Committed())
	verifyDir(t, dir, exps)
}

// TestInvalidBoxes: a Like checkpoint whose boxes do not tile the tensor
// is caught by the save-time checks before anything is written. (Like
// with a matching name and shape but overlapping chunks.)
func TestInvalidBoxes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bad")
	f := makeST(t, 1, spec{"a", safetensors.F32, []int64{4}})
	like := fakeLike("a", []int64{4}, [][2][]int64{{{0}, {3}}, {{2}, {2}}})
	d, err := openDir(dir, Target{WorldSize: 2, Like: like}, nil)
	require.NoError(t, err)
	err = d.Commit(f.reader(), f.header)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "overlap")
	assert.Empty(t, shardFiles(t, dir))
	_, err = os.Stat(filepath.Join(dir, ".metadata"))
	assert.True(t, os.IsNotExist(err))
}

// TestExtendTorchCheckpoint commits into copies of checkpoints written by
// torch (torchdcp/testdata): every earlier entry, BYTE_IO objects, storage
// infos (zstd transform descriptors included) and int planner path elements
// survive the rewrite.
func TestExtendTorchCheckpoint(t *testing.T) {
	for _, name := range []string{"nested", "sharded", "zstd", "plain"} {
		t.Run(name, func(t *testing.T) {
			src := filepath.Join("..", "torchdcp", "testdata", name)
			dir := filepath.Join(t.TempDir(), name)
			copyDir(t, src, dir)
			oldBytes, err := os.ReadFile(filepath.Join(dir, ".metadata"))
			require.NoError(t, err)
			old := decodeDir(t, dir)
			oldRaw := rawPlanner(t, oldBytes)
			oldData := readAllChunks(t, dir)

			target := Target{WorldSize: 2, Prefix: "model"}
			f := makeST(t, 1, spec{"new.weight", safetensors.BF16, []int64{3, 4}})
			exps := commitAll(t, dir, target, f)
			verifyDir(t, dir, exps)

			newBytes, err := os.ReadFile(filepath.Join(dir, ".metadata"))
			require.NoError(t, err)
			m := decodeDir(t, dir)
			require.Equal(t, old.Items, m.Items[:len(old.Items)])
			require.Equal(t, old.Storage, m.Storage[:len(old.Storage)])
			assert.Equal(t, old.Version, m.Version)
			newRaw := rawPlanner(t, newBytes)
			for k, v := range oldRaw {
				assert.Equal(t, v, newRaw[k], "planner_data[%q]", k)
			}
			assert.Equal(t, pickle.Tuple{"model", "new.weight"}, newRaw["model.new.weight"])
			for k, v := range oldData {
				assert.Equal(t, v, readAllChunks(t, dir)[k], k)
			}
			// New files do not reuse a number torch used.
			for _, s := range m.Storage[len(old.Storage):] {
				for _, o := range old.Storage {
					assert.NotEqual(t, o.Info.RelativePath, s.Info.RelativePath)
				}
			}
		})
	}
}

func rawPlanner(t *testing.T, b []byte) map[string]any {
	t.Helper()
	v, err := pickle.DecodeBytes(b, pickle.Options{})
	require.NoError(t, err)
	st := v.(*pickle.Object).StateDict()
	pd, _ := st.Get("planner_data")
	out := map[string]any{}
	if d, ok := pd.(*pickle.Dict); ok {
		for _, it := range d.Items() {
			out[it.Key.(string)] = it.Value
		}
	}
	return out
}

// readAllChunks reads every chunk of every tensor of dir.
func readAllChunks(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	c, err := treetest.OpenLocal(dir, torchdcp.Reader.Open)
	require.NoError(t, err)
	defer c.Close()
	out := map[string][]byte{}
	for _, tt := range c.Tensors {
		for _, ch := range tt.Chunks.All() {
			n := int64(tt.DType.Size())
			for _, s := range ch.Sizes {
				n *= s
			}
			b := make([]byte, n)
			if n > 0 {
				_, err := ch.Source.ReadAt(b, 0)
				require.NoError(t, err)
			}
			out[fmt.Sprintf("%s%v", tt.Name, ch.Offsets)] = b
		}
	}
	return out
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dst, 0o755))
	ents, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range ents {
		in, err := os.Open(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		out, err := os.Create(filepath.Join(dst, e.Name()))
		require.NoError(t, err)
		_, err = io.Copy(out, in)
		require.NoError(t, err)
		in.Close()
		require.NoError(t, out.Close())
	}
}

func TestOpenDirRefuses(t *testing.T) {
	// Megatron's MCoreMetadata carries mcore_data the writer would drop.
	dir := filepath.Join(t.TempDir(), "mcore")
	require.NoError(t, os.Mkdir(dir, 0o755))
	b, err := os.ReadFile(filepath.Join("..", "torchdcp", "testdata", "plain_mcore.metadata"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".metadata"), b, 0o644))
	_, err = openDir(dir, Target{}, nil)
	require.ErrorIs(t, err, ErrUnsupported)

	// Rank-local checkpoint without a global .metadata.
	dir = filepath.Join(t.TempDir(), "local")
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "__0.metadata"), []byte("x"), 0o644))
	_, err = openDir(dir, Target{}, nil)
	require.ErrorIs(t, err, ErrUnsupported)

	// Garbage .metadata.
	dir = filepath.Join(t.TempDir(), "junk")
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".metadata"), []byte("junk"), 0o644))
	_, err = openDir(dir, Target{}, nil)
	require.Error(t, err)

	// A file, not a directory.
	p := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(p, nil, 0o644))
	_, err = openDir(p, Target{}, nil)
	require.Error(t, err)
}

// TestConcurrentCommitted reads the committed names while commits run (go
// test -race checks the locking).
func TestConcurrentCommitted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cc")
	d, err := openDir(dir, Target{WorldSize: 2}, nil)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 4; i++ {
			f := makeST(t, i, spec{fmt.Sprintf("t%d", i), safetensors.F32, []int64{8, 2}})
			assert.NoError(t, d.Commit(f.reader(), f.header))
		}
	}()
	for n := 0; n < 4; {
		select {
		case <-done:
			n = 4
		default:
			n = len(d.Committed())
		}
	}
	<-done
	assert.Equal(t, []string{"t0", "t1", "t2", "t3"}, d.Committed())
}
