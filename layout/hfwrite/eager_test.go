package hfwrite

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/layout/internal/sttest"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/safetensors"
)

type tspec struct {
	name  string
	dtype safetensors.DType
	shape []int64
}

// stFile returns a safetensors file of specs with bytes derived from seed.
func stFile(t *testing.T, seed byte, specs ...tspec) []byte {
	t.Helper()
	data, _ := sttest.Build(t, map[string]string{"format": "pt"}, func(ti safetensors.TensorInfo) []byte {
		b := make([]byte, ti.Size())
		for i := range b {
			b[i] = seed + byte(i*7+i/251)
		}
		return b
	}, sttests(specs)...)
	return data
}

func sttests(specs []tspec) []sttest.Spec {
	out := make([]sttest.Spec, len(specs))
	for i, s := range specs {
		out[i] = sttest.Spec{Name: s.name, DType: s.dtype, Shape: s.shape}
	}
	return out
}

var eagerSpecs = [][]tspec{
	{
		{"embed", safetensors.BF16, []int64{131, 64}}, {"q.weight", safetensors.F32, []int64{64, 48}},
		{"norm", safetensors.F32, []int64{64}}, {"step", safetensors.I64, nil}, {"empty", safetensors.F32, []int64{0, 4}},
	},
	{{"lm_head", safetensors.F16, []int64{131, 64}}, {"gate", safetensors.F32, []int64{40, 100}}},
}

// writeSeq writes data to f front to back in pieces of n bytes, yielding
// between them so that the eager reshard runs alongside.
func writeSeq(t *testing.T, f *File, data []byte, n int) {
	t.Helper()
	for off := 0; off < len(data); off += n {
		_, err := f.WriteAt(data[off:min(off+n, len(data))], int64(off))
		require.NoError(t, err)
		if off/n%8 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
}

// waitClaimed waits until the eager reshard of f has read n bytes.
func waitClaimed(t *testing.T, f *File, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		f.stream.mu.Lock()
		defer f.stream.mu.Unlock()
		return f.stream.claimed >= int64(n)
	}, 10*time.Second, time.Millisecond)
}

// dirFiles is the content of every file of dir, once its writer is closed.
func dirFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string][]byte{}
	for _, e := range ents {
		require.False(t, e.IsDir(), "%s left in %s", e.Name(), dir)
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		out[e.Name()] = b
	}
	return out
}

func shards(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		if _, _, ok := torchdcp.ParseShardName(e.Name()); ok {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// TestEagerSameAsFallback: files written front to back are committed from
// their eager reshard, files whose resharded bytes were rewritten are
// resharded at Commit, and both give the same bytes.
func TestEagerSameAsFallback(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target dcpwrite.Target
	}{
		{"world1", dcpwrite.Target{WorldSize: 1}},
		{"world3", dcpwrite.Target{WorldSize: 3}},
		{"world4", dcpwrite.Target{WorldSize: 4}},
		{"world4-shard1", dcpwrite.Target{WorldSize: 4, Rules: []dcpwrite.Rule{{Pattern: regexp.MustCompile(`^(q|gate)`), Dim: 1}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eager, fallback := filepath.Join(t.TempDir(), "e"), filepath.Join(t.TempDir(), "f")
			we, err := createSession(eager, Options{Target: tc.target})
			require.NoError(t, err)
			wf, err := createSession(fallback, Options{Target: tc.target})
			require.NoError(t, err)
			for i, specs := range eagerSpecs {
				data := stFile(t, byte(i), specs...)
				name := "model-" + string(rune('a'+i)) + ".safetensors"

				f := create(t, we, name)
				writeSeq(t, f, data, 1000)
				require.NoError(t, f.Commit())
				assert.True(t, f.Eager(), "written front to back: committed eagerly")

				// Rewriting bytes already resharded voids the eager reshard.
				g := create(t, wf, name)
				writeSeq(t, g, data, 1000)
				waitClaimed(t, g, len(data))
				_, err = g.WriteAt(data[100:200], 100)
				require.NoError(t, err)
				require.NoError(t, g.Commit())
				assert.False(t, g.Eager())
			}
			require.NoError(t, we.Close())
			require.NoError(t, wf.Close())
			assert.Equal(t, dirFiles(t, fallback), dirFiles(t, eager))
		})
	}
}

// TestEagerOutOfOrder: writes that are not front to back give the right
// checkpoint, from the eager reshard where nothing it read changed.
func TestEagerOutOfOrder(t *testing.T) {
	target := dcpwrite.Target{WorldSize: 3, Rules: []dcpwrite.Rule{{Pattern: regexp.MustCompile(`^gate`), Dim: 1}}}
	data := stFile(t, 1, eagerSpecs[1]...)
	other := stFile(t, 9, eagerSpecs[1]...) // same header, other bytes
	half := len(data) / 2
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, w *Session) *File
		eager int // 1: committed eagerly, 0: not, -1: either (timing)
	}{
		{"hole filled later", func(t *testing.T, w *Session) *File {
			f := create(t, w, "m.safetensors")
			_, err := f.WriteAt(data[half:], int64(half))
			require.NoError(t, err)
			writeSeq(t, f, data[:half], 777)
			return f
		}, 1},
		{"overwrite before the resharder reads", func(t *testing.T, w *Session) *File {
			f := create(t, w, "m.safetensors")
			// The header is missing: nothing is read yet.
			_, err := f.WriteAt(other[100:], 100)
			require.NoError(t, err)
			_, err = f.WriteAt(data[half:], int64(half))
			require.NoError(t, err)
			// Once the header is there, every byte is: the resharder may
			// read ahead of the writes that follow, which then void it.
			writeSeq(t, f, data[:half], 777)
			return f
		}, -1},
		{"concurrent writers", func(t *testing.T, w *Session) *File {
			f := create(t, w, "m.safetensors")
			const piece, n = 1000, 4
			var wg sync.WaitGroup
			for g := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for off := g * piece; off < len(data); off += n * piece {
						_, err := f.WriteAt(data[off:min(off+piece, len(data))], int64(off))
						assert.NoError(t, err)
					}
				}()
			}
			wg.Wait()
			return f
		}, 1},
		{"rewrite of resharded bytes", func(t *testing.T, w *Session) *File {
			f := create(t, w, "m.safetensors")
			writeSeq(t, f, other, 4096)
			waitClaimed(t, f, len(other))
			writeSeq(t, f, data, 4096) // seek back, write it all again
			return f
		}, 0},
		{"truncate", func(t *testing.T, w *Session) *File {
			f := create(t, w, "m.safetensors")
			writeSeq(t, f, other, 4096)
			waitClaimed(t, f, len(other))
			require.NoError(t, f.Truncate(0))
			writeSeq(t, f, data, 4096)
			return f
		}, 0},
		{"truncate before writing", func(t *testing.T, w *Session) *File {
			f := create(t, w, "m.safetensors")
			require.NoError(t, f.Truncate(0))
			writeSeq(t, f, data, 4096)
			return f
		}, 1},
		{"renamed from a temp name", func(t *testing.T, w *Session) *File {
			f := create(t, w, ".tmp123")
			writeSeq(t, f, data[:half], 4096)
			require.NoError(t, w.Rename(f.Name(), "m.safetensors", false))
			_, err := f.WriteAt(data[half:], int64(half))
			require.NoError(t, err)
			return f
		}, 1},
		{"renamed when complete", func(t *testing.T, w *Session) *File {
			// safetensors' save_file: a temp file renamed once written.
			f := create(t, w, ".tmpAbC123")
			writeSeq(t, f, data, 4096)
			require.NoError(t, w.Rename(f.Name(), "m.safetensors", false))
			return f
		}, 1},
		{"renamed away and back", func(t *testing.T, w *Session) *File {
			f := create(t, w, "m.safetensors")
			writeSeq(t, f, data[:half], 4096)
			require.NoError(t, w.Rename(f.Name(), "m.bin", false))
			require.NoError(t, w.Rename(f.Name(), "m.safetensors", false))
			_, err := f.WriteAt(data[half:], int64(half))
			require.NoError(t, err)
			return f
		}, 1},
		{"renamed to an index and back", func(t *testing.T, w *Session) *File {
			f := create(t, w, "m.safetensors")
			writeSeq(t, f, data[:half], 4096)
			require.NoError(t, w.Rename(f.Name(), "m.safetensors.index.json", false))
			require.NoError(t, w.Rename(f.Name(), "m.safetensors", false))
			_, err := f.WriteAt(data[half:], int64(half))
			require.NoError(t, err)
			return f
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := filepath.Join(t.TempDir(), "want")
			w, err := createSession(want, Options{Target: target})
			require.NoError(t, err)
			require.NoError(t, put(t, w, "m.safetensors", data))
			require.NoError(t, w.Close())

			dir := filepath.Join(t.TempDir(), "got")
			w, err = createSession(dir, Options{Target: target})
			require.NoError(t, err)
			f := tc.write(t, w)
			require.NoError(t, f.Commit())
			if tc.eager >= 0 {
				assert.Equal(t, tc.eager == 1, f.Eager())
			}
			require.NoError(t, w.Close())
			assert.Equal(t, dirFiles(t, want), dirFiles(t, dir))
		})
	}
}

// TestEagerRenamedToSidecar: a safetensors file renamed to another name
// before it is closed is stored as-is; its eager shard files go.
func TestEagerRenamedToSidecar(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "c")
	w, err := createSession(dir, Options{Target: dcpwrite.Target{WorldSize: 2}})
	require.NoError(t, err)
	data := stFile(t, 1, eagerSpecs[0]...)
	f := create(t, w, "m.safetensors")
	writeSeq(t, f, data, 4096)
	waitClaimed(t, f, len(data))
	require.NoError(t, w.Rename(f.Name(), "m.bin", false))
	require.NoError(t, f.Commit())
	require.NoError(t, w.Close())
	got := dirFiles(t, dir)
	assert.Equal(t, map[string][]byte{"m.bin": data}, got)
}

// TestEagerFailureCommitsNothing: when the reshard fails (here: a shard
// file name is taken, so that both the eager reshard and the one at Commit
// fail after creating some files), Commit fails, nothing is committed and
// no shard file is left.
func TestEagerFailureCommitsNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "c")
	w, err := createSession(dir, Options{Target: dcpwrite.Target{WorldSize: 3}})
	require.NoError(t, err)
	require.NoError(t, put(t, w, "a.safetensors", stFile(t, 1, eagerSpecs[0]...)))
	require.NoError(t, w.Close())
	before := dirFiles(t, dir)
	w, err = createSession(dir, Options{Target: dcpwrite.Target{WorldSize: 3}})
	require.NoError(t, err)
	planted := filepath.Join(dir, "__2_1.distcp")
	require.NoError(t, os.WriteFile(planted, []byte("not ours"), 0o644))

	data := stFile(t, 2, eagerSpecs[1]...)
	f := create(t, w, "b.safetensors")
	writeSeq(t, f, data, 4096)
	err = f.Commit()
	require.ErrorIs(t, err, ErrCommit)
	require.ErrorIs(t, err, os.ErrExist)
	require.NoError(t, os.Remove(planted))
	require.NoError(t, w.Close())
	assert.Equal(t, before, dirFiles(t, dir))

	// The directory is usable, the file number free.
	w, err = createSession(dir, Options{Target: dcpwrite.Target{WorldSize: 3}})
	require.NoError(t, err)
	require.NoError(t, put(t, w, "b.safetensors", data))
	require.NoError(t, w.Close())
	assert.Contains(t, shards(t, dir), "__2_1.distcp")
}

// TestEagerKilledWriter: a process killed while a file is being resharded
// eagerly leaves its spool and partial shard files; nothing is committed,
// and CleanStale (at the next mount) or Create removes them all. The writer
// is this test run again, in a child process, with HFWRITE_EAGER_KILLED set.
func TestEagerKilledWriter(t *testing.T) {
	if dir := os.Getenv("HFWRITE_EAGER_KILLED"); dir != "" {
		eagerKilledWriter(t, dir) // this process is the writer to kill
	}
	for _, clean := range []string{"CleanStale", "Create"} {
		t.Run(clean, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "k")
			w, err := createSession(dir, Options{Target: dcpwrite.Target{WorldSize: 2}})
			require.NoError(t, err)
			require.NoError(t, put(t, w, "a.safetensors", stFile(t, 1, eagerSpecs[0]...)))
			require.NoError(t, w.Close())
			before := dirFiles(t, dir)

			cmd := exec.Command(os.Args[0], "-test.run=^TestEagerKilledWriter$")
			cmd.Env = append(os.Environ(), "HFWRITE_EAGER_KILLED="+dir)
			out, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			sc := bufio.NewScanner(out)
			for sc.Scan() && !strings.Contains(sc.Text(), "resharding") {
			}
			require.NoError(t, cmd.Process.Kill())
			cmd.Wait()

			// What the killed writer left: partial shards and a spool.
			assert.Subset(t, shards(t, dir), []string{"__0_1.distcp", "__1_1.distcp"})
			parts, err := os.ReadDir(filepath.Join(dir, SpoolDir))
			require.NoError(t, err)
			assert.Len(t, parts, 1)
			meta, err := os.ReadFile(filepath.Join(dir, ".metadata"))
			require.NoError(t, err)
			assert.Equal(t, before[".metadata"], meta, "nothing committed")

			if clean == "CleanStale" {
				removed, err := CleanStale(openDir(t, dir))
				require.NoError(t, err)
				assert.True(t, removed)
			} else {
				w, err := createSession(dir, Options{Target: dcpwrite.Target{WorldSize: 2}})
				require.NoError(t, err)
				require.NoError(t, w.Close())
			}
			assert.Equal(t, before, dirFiles(t, dir))
		})
	}
}

// eagerKilledWriter is the process TestEagerKilledWriter kills: it writes
// most of a file and waits, its eager reshard under way.
func eagerKilledWriter(t *testing.T, dir string) {
	w, err := createSession(dir, Options{Target: dcpwrite.Target{WorldSize: 2}})
	require.NoError(t, err)
	f := create(t, w, "b.safetensors")
	data := stFile(t, 2, eagerSpecs[1]...)
	writeSeq(t, f, data[:len(data)*3/4], 4096)
	waitClaimed(t, f, len(data)/2)
	os.Stdout.WriteString("resharding\n")
	select {}
}
