package vfs

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/layout/ckpt"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/writetest"
	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/layout/hfdir"
	"github.com/ckptfs/ckptfs/layout/hfwrite"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/safetensors"
)

func TestWriteRoundTrip(t *testing.T) {
	rules, err := dcpwrite.ParseRules(strings.NewReader("q_proj|gate_proj 0\no_proj|down_proj 1\nnorm replicate\n"))
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		target dcpwrite.Target
	}{
		{"fsdp2_3", dcpwrite.Target{WorldSize: 3}},
		{"tp_plan_4", dcpwrite.Target{WorldSize: 4, Rules: rules}},
		{"prefix_model_2", dcpwrite.Target{WorldSize: 2, Prefix: "model"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, want := hfDir(t)
			src := t.TempDir()
			mnt := testMount(t, newFS(t, src, writable(tc.target)))
			dir := filepath.Join(mnt, "imported")
			require.NoError(t, os.Mkdir(dir, 0o755))
			// cp, a real client, in the order save_pretrained writes.
			out, err := exec.Command("cp",
				filepath.Join(in, "config.json"), filepath.Join(in, "tokenizer.json"),
				filepath.Join(in, "model-00001-of-00002.safetensors"), filepath.Join(in, "model-00002-of-00002.safetensors"),
				filepath.Join(in, hfdir.SafetensorsIndex), dir).CombinedOutput()
			require.NoError(t, err, string(out))

			require.Equal(t, []string{"config.json", "model.safetensors", hfdir.SafetensorsIndex, "tokenizer.json"}, listDir(t, dir))
			require.Equal(t, want, readTensors(t, dir), "tensors read back through the view")
			for _, sc := range []string{"config.json", "tokenizer.json"} {
				got, err := os.ReadFile(filepath.Join(dir, sc))
				require.NoError(t, err)
				exp, err := os.ReadFile(filepath.Join(in, sc))
				require.NoError(t, err)
				require.Equal(t, exp, got, sc)
			}
			var idx struct {
				WeightMap map[string]string `json:"weight_map"`
			}
			b, err := os.ReadFile(filepath.Join(dir, hfdir.SafetensorsIndex))
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(b, &idx))
			require.Len(t, idx.WeightMap, len(want))

			// The backing directory is a DCP checkpoint laid out by the target.
			back := filepath.Join(src, "imported")
			require.Empty(t, spoolFiles(t, back))
			require.NotContains(t, listDir(t, back), ".metadata.tmp")
			c, err := layout.Open(back)
			require.NoError(t, err)
			defer c.Close()
			require.Equal(t, ckpt.FormatTorchDCP, c.Format)
			require.Len(t, c.Tensors, len(want))
			for _, ct := range c.Tensors {
				name := strings.TrimPrefix(ct.Name, tc.target.Prefix+".")
				if tc.target.Prefix != "" {
					require.True(t, strings.HasPrefix(ct.Name, tc.target.Prefix+"."), ct.Name)
				}
				var shape []int64
				for _, s := range append(llamaA, llamaB...) {
					if s.name == name {
						shape = s.shape
					}
				}
				require.Equal(t, len(tc.target.Chunks(name, shape)), ct.Chunks.Len(), ct.Name)
			}

			// A later mount (read-only) shows the same bytes.
			requireSameFiles(t, dir, filepath.Join(testMount(t, newFS(t, src)), "imported"))
		})
	}
}

// TestWriteTargetStaysWritable: a target with a .metadata still takes
// files, and its view grows with each commit.
func TestWriteTargetStaysWritable(t *testing.T) {
	in, _ := hfDir(t)
	src := t.TempDir()
	mnt := testMount(t, newFS(t, src, writable(dcpwrite.Target{WorldSize: 2})))
	dir := filepath.Join(mnt, "new")
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.Empty(t, listDir(t, dir))
	a, err := os.ReadFile(filepath.Join(in, "model-00001-of-00002.safetensors"))
	require.NoError(t, err)
	require.NoError(t, writeFile(t, filepath.Join(dir, "a.safetensors"), a))
	first := readTensors(t, dir)
	require.Len(t, first, len(llamaA))
	b, err := os.ReadFile(filepath.Join(in, "model-00002-of-00002.safetensors"))
	require.NoError(t, err)
	// while a file is being written, it is listed under its name
	f, err := os.Create(filepath.Join(dir, "b.safetensors"))
	require.NoError(t, err)
	_, err = f.Write(b[:100])
	require.NoError(t, err)
	require.Contains(t, listDir(t, dir), "b.safetensors")
	fi, err := os.Stat(filepath.Join(dir, "b.safetensors"))
	require.NoError(t, err)
	require.Equal(t, int64(100), fi.Size())
	_, err = f.WriteAt(b[100:], 100)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.Equal(t, []string{"model.safetensors", hfdir.SafetensorsIndex}, listDir(t, dir))
	all := readTensors(t, dir)
	require.Len(t, all, len(llamaA)+len(llamaB))
	for n, v := range first {
		require.Equal(t, v, all[n])
	}
	// sidecars can be rewritten, renamed and removed
	require.NoError(t, writeFile(t, filepath.Join(dir, "notes.txt"), []byte("one")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("two!"), 0o644))
	got, err := os.ReadFile(filepath.Join(dir, "notes.txt"))
	require.NoError(t, err)
	require.Equal(t, "two!", string(got))
	require.NoError(t, os.Rename(filepath.Join(dir, "notes.txt"), filepath.Join(dir, "README.md")))
	require.NoError(t, os.Remove(filepath.Join(dir, "README.md")))
	require.Equal(t, []string{"model.safetensors", hfdir.SafetensorsIndex}, listDir(t, dir))
	// committed tensors cannot be removed
	require.ErrorIs(t, os.Remove(filepath.Join(dir, "model.safetensors")), syscall.EPERM)
}

// TestWriteTempThenRename covers safetensors' save_file (write a temp file,
// rename it while open, close) and write, close, then rename.
func TestWriteTempThenRename(t *testing.T) {
	in, want := hfDir(t)
	src := t.TempDir()
	mnt := testMount(t, newFS(t, src, writable(dcpwrite.Target{WorldSize: 2})))
	dir := filepath.Join(mnt, "new")
	require.NoError(t, os.Mkdir(dir, 0o755))
	a, err := os.ReadFile(filepath.Join(in, "model-00001-of-00002.safetensors"))
	require.NoError(t, err)
	f, err := os.OpenFile(filepath.Join(dir, ".tmpAbCd"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(int64(len(a))))
	_, err = f.Write(a)
	require.NoError(t, err)
	require.NoError(t, os.Rename(filepath.Join(dir, ".tmpAbCd"), filepath.Join(dir, "model-00001-of-00002.safetensors")))
	require.NoError(t, f.Close())

	// the same again: the rename of the complete file commits, and fails
	f, err = os.OpenFile(filepath.Join(dir, ".tmpEfGh"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	require.NoError(t, err)
	_, err = f.Write(a)
	require.NoError(t, err)
	require.ErrorIs(t, os.Rename(filepath.Join(dir, ".tmpEfGh"), filepath.Join(dir, "again.safetensors")), syscall.EIO)
	require.ErrorIs(t, f.Close(), syscall.EIO)
	require.Empty(t, spoolFiles(t, filepath.Join(src, "new")))

	b, err := os.ReadFile(filepath.Join(in, "model-00002-of-00002.safetensors"))
	require.NoError(t, err)
	require.NoError(t, writeFile(t, filepath.Join(dir, "b.tmp"), b))
	require.NoError(t, os.Rename(filepath.Join(dir, "b.tmp"), filepath.Join(dir, "model-00002-of-00002.safetensors")))
	require.Equal(t, want, readTensors(t, dir))

	// a stored file that is not valid safetensors: the rename fails, nothing committed
	require.NoError(t, writeFile(t, filepath.Join(dir, "c.tmp"), []byte("not safetensors")))
	meta, err := os.ReadFile(filepath.Join(src, "new", ".metadata"))
	require.NoError(t, err)
	require.ErrorIs(t, os.Rename(filepath.Join(dir, "c.tmp"), filepath.Join(dir, "c.safetensors")), syscall.EIO)
	after, err := os.ReadFile(filepath.Join(src, "new", ".metadata"))
	require.NoError(t, err)
	require.Equal(t, meta, after)
	require.Equal(t, want, readTensors(t, dir))
}

func TestWriteBadInput(t *testing.T) {
	in, _ := hfDir(t)
	a, err := os.ReadFile(filepath.Join(in, "model-00001-of-00002.safetensors"))
	require.NoError(t, err)
	f4 := filepath.Join(t.TempDir(), "f4.safetensors")
	writeST(t, f4, 3, tspec{"packed", safetensors.F4, []int64{4, 8}})
	f4data, err := os.ReadFile(f4)
	require.NoError(t, err)
	dupPath := filepath.Join(t.TempDir(), "dup.safetensors")
	writeST(t, dupPath, 4, tspec{"fresh", safetensors.F32, []int64{3}}, llamaA[1])
	dup, err := os.ReadFile(dupPath)
	require.NoError(t, err)
	goodPath := filepath.Join(t.TempDir(), "good.safetensors")
	writeST(t, goodPath, 5, tspec{"good", safetensors.F32, []int64{3}})
	good, err := os.ReadFile(goodPath)
	require.NoError(t, err)

	for _, tc := range []struct {
		name  string
		first []byte // committed before, if set
		file  string
		data  []byte
	}{
		{"not safetensors", nil, "x.safetensors", []byte("this is not a safetensors file at all")},
		{"truncated", nil, "x.safetensors", a[:len(a)-10]},
		{"trailing bytes", nil, "x.safetensors", append(append([]byte{}, a...), 0)},
		{"dtype torch cannot hold", nil, "x.safetensors", f4data},
		{"tensor written twice", a, "y.safetensors", dup},
		{"index disagrees", a, hfdir.SafetensorsIndex, []byte(`{"weight_map": {"model.norm.weight": "a.safetensors"}}`)},
		{"index is not json", a, hfdir.SafetensorsIndex, []byte(`{"weight_map": `)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := t.TempDir()
			mnt := testMount(t, newFS(t, src, writable(dcpwrite.Target{WorldSize: 3})))
			dir, back := filepath.Join(mnt, "new"), filepath.Join(src, "new")
			require.NoError(t, os.Mkdir(dir, 0o755))
			var meta []byte
			var before []string
			if tc.first != nil {
				require.NoError(t, writeFile(t, filepath.Join(dir, "a.safetensors"), tc.first))
				meta, err = os.ReadFile(filepath.Join(back, ".metadata"))
				require.NoError(t, err)
			}
			before = shardFiles(t, back)
			view := listDir(t, dir)

			require.ErrorIs(t, writeFile(t, filepath.Join(dir, tc.file), tc.data), syscall.EIO)

			require.Equal(t, before, shardFiles(t, back), "no shard files left behind")
			if meta != nil {
				got, err := os.ReadFile(filepath.Join(back, ".metadata"))
				require.NoError(t, err)
				require.Equal(t, meta, got, ".metadata untouched")
			}
			require.Empty(t, spoolFiles(t, back))
			require.Equal(t, view, listDir(t, dir))
			if tc.first != nil {
				require.Len(t, readTensors(t, dir), len(llamaA))
			}
			// the name is free again: a good file of that name commits
			if tc.file != hfdir.SafetensorsIndex {
				require.NoError(t, writeFile(t, filepath.Join(dir, tc.file), good))
				require.Contains(t, readTensors(t, dir), "good")
			}
		})
	}
}

// TestWriteKilledWriter: a writer killed mid-file commits nothing (the
// kernel flushes its descriptor at exit), and the spool is cleaned. The
// writer is this test run again, in a child process, with
// CKPTFS_KILLED_WRITER set.
func TestWriteKilledWriter(t *testing.T) {
	if dst := os.Getenv("CKPTFS_KILLED_WRITER"); dst != "" {
		killedWriter(t, dst)
	}
	in, _ := hfDir(t)
	src := t.TempDir()
	mnt := testMount(t, newFS(t, src, writable(dcpwrite.Target{WorldSize: 2})))
	dir := filepath.Join(mnt, "new")
	require.NoError(t, os.Mkdir(dir, 0o755))
	cmd := exec.Command(os.Args[0], "-test.run=^TestWriteKilledWriter$")
	cmd.Env = append(os.Environ(), "CKPTFS_KILLED_WRITER="+filepath.Join(dir, "a.safetensors"),
		"CKPTFS_KILLED_WRITER_SRC="+filepath.Join(in, "model-00001-of-00002.safetensors"))
	err := cmd.Run()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal())
	back := filepath.Join(src, "new")
	require.Empty(t, shardFiles(t, back))
	require.Eventually(t, func() bool { return len(spoolFiles(t, back)) == 0 }, 5*time.Second, 10*time.Millisecond)
	require.Empty(t, listDir(t, dir))
}

// killedWriter is the writer TestWriteKilledWriter runs and kills: it
// writes part of a file and dies holding it open.
func killedWriter(t *testing.T, dst string) {
	data, err := os.ReadFile(os.Getenv("CKPTFS_KILLED_WRITER_SRC"))
	require.NoError(t, err)
	f, err := os.Create(dst)
	require.NoError(t, err)
	_, err = f.Write(data[:len(data)/2])
	require.NoError(t, err)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// TestStaleSpoolCleanedAtNextMount: the spool of a ckptfs that died
// mid-write is removed by the next writable mount where it writes; what
// was committed stays.
func TestStaleSpoolCleanedAtNextMount(t *testing.T) {
	in, _ := hfDir(t)
	a, err := os.ReadFile(filepath.Join(in, "model-00001-of-00002.safetensors"))
	require.NoError(t, err)
	src := t.TempDir()
	back := filepath.Join(src, "new")
	fsys := newFS(t, src, writable(dcpwrite.Target{WorldSize: 2}))
	mnt := testMount(t, fsys)
	dir := filepath.Join(mnt, "new")
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, writeFile(t, filepath.Join(dir, "a.safetensors"), a))
	f, err := os.Create(filepath.Join(dir, "b.safetensors"))
	require.NoError(t, err)
	_, err = f.Write(a[:5000])
	require.NoError(t, err)
	// What a killed ckptfs leaves: a copy of the spool as it is now.
	require.Len(t, spoolFiles(t, back), 1)
	saved := filepath.Join(t.TempDir(), "spool")
	require.NoError(t, os.CopyFS(saved, os.DirFS(filepath.Join(back, hfwrite.SpoolDir))))
	require.ErrorIs(t, f.Close(), syscall.EIO)
	meta, err := os.ReadFile(filepath.Join(back, ".metadata"))
	require.NoError(t, err)
	fsys.Close() // as at unmount: the spool goes
	_, err = os.Stat(filepath.Join(back, hfwrite.SpoolDir))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, os.CopyFS(filepath.Join(back, hfwrite.SpoolDir), os.DirFS(saved)))
	// and the shard files of the eager reshard of b.safetensors under way
	for _, n := range []string{"__0_9.distcp", "__1_9.distcp"} {
		require.NoError(t, os.WriteFile(filepath.Join(back, n), []byte("PK\x03\x04partial"), 0o644))
	}

	// The next mount (writable) never lists it, and removes it when it
	// writes beside it (a mkdir), not when it is looked up.
	mnt2 := testMount(t, newFS(t, src, writable(dcpwrite.Target{})))
	require.NotContains(t, listDir(t, filepath.Join(mnt2, "new")), hfwrite.SpoolDir)
	for _, n := range []string{hfwrite.SpoolDir, "__0_9.distcp", "__1_9.distcp"} {
		_, err = os.Stat(filepath.Join(mnt2, "new", n))
		require.ErrorIs(t, err, os.ErrNotExist, n)
		_, err = os.Stat(filepath.Join(back, n))
		require.NoError(t, err, "%s removed by a lookup", n)
	}
	require.NoError(t, os.Mkdir(filepath.Join(mnt2, "next"), 0o755))
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(back, hfwrite.SpoolDir))
		return errors.Is(err, os.ErrNotExist)
	}, 5*time.Second, 10*time.Millisecond)
	for _, n := range []string{"__0_9.distcp", "__1_9.distcp"} {
		_, err = os.Stat(filepath.Join(back, n))
		require.ErrorIs(t, err, os.ErrNotExist, n)
	}
	got, err := os.ReadFile(filepath.Join(back, ".metadata"))
	require.NoError(t, err)
	require.Equal(t, meta, got)
	require.Len(t, readTensors(t, filepath.Join(mnt2, "new")), len(llamaA))
	// the directory is an ordinary read-only checkpoint now
	require.ErrorIs(t, writeFileErr(filepath.Join(mnt2, "new", "c.safetensors")), syscall.EROFS)
}

func writeFileErr(path string) error {
	return os.WriteFile(path, []byte("x"), 0o644)
}

func TestWriteRefused(t *testing.T) {
	in, _ := hfDir(t)
	a, err := os.ReadFile(filepath.Join(in, "model-00001-of-00002.safetensors"))
	require.NoError(t, err)
	src := t.TempDir()
	// an existing checkpoint
	root, err := writetest.MakeDir(filepath.Join(src, "ckpt"))
	require.NoError(t, err)
	w, err := hfwrite.CreateIn(root, hfwrite.Options{})
	require.NoError(t, err)
	wh, err := w.Create("a.safetensors")
	require.NoError(t, err)
	_, err = wh.WriteAt(a, 0)
	require.NoError(t, err)
	require.NoError(t, wh.Flush())
	wh.Release()
	require.NoError(t, w.Close())
	require.NoError(t, os.Mkdir(filepath.Join(src, "plain"), 0o755))

	ro := testMount(t, newFS(t, src))
	require.ErrorIs(t, os.Mkdir(filepath.Join(ro, "new"), 0o755), syscall.EROFS)
	require.ErrorIs(t, writeFileErr(filepath.Join(ro, "plain", "x.safetensors")), syscall.EROFS)

	mnt := testMount(t, newFS(t, src, writable(dcpwrite.Target{})))
	require.ErrorIs(t, writeFileErr(filepath.Join(mnt, "x.txt")), syscall.EROFS, "the root is not a write target")
	require.ErrorIs(t, writeFileErr(filepath.Join(mnt, "plain", "x.txt")), syscall.EROFS, "nor a directory that existed")
	require.ErrorIs(t, writeFileErr(filepath.Join(mnt, "ckpt", "x.safetensors")), syscall.EROFS, "existing checkpoints are read-only")
	require.ErrorIs(t, os.Mkdir(filepath.Join(mnt, "ckpt", "sub"), 0o755), syscall.EROFS)
	require.ErrorIs(t, os.WriteFile(filepath.Join(mnt, "ckpt", "model.safetensors"), nil, 0o644), syscall.EROFS)
	require.NoError(t, os.Mkdir(filepath.Join(mnt, "plain", "new"), 0o755), "mkdir in a plain directory")
	fi, err := os.Stat(filepath.Join(mnt, "plain", "new"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), fi.Mode().Perm())
	for _, name := range []string{".metadata", "__0_0.distcp", ".metadata.tmp"} {
		require.ErrorIs(t, writeFileErr(filepath.Join(mnt, "plain", "new", name)), syscall.EPERM, name)
	}
	require.ErrorIs(t, os.Mkdir(filepath.Join(mnt, "plain", "new", hfwrite.SpoolDir), 0o755), syscall.EPERM)
}

// TestWriteDiskFull: a commit that runs out of space fails at close with
// EIO and leaves the committed state and the free space as they were.
func TestWriteDiskFull(t *testing.T) {
	// Needs root to mount a small tmpfs, as every test here needs it to
	// mount FUSE: without it this fails, never skips.
	src := t.TempDir()
	if err := syscall.Mount("tmpfs", src, "tmpfs", 0, "size=3m"); err != nil {
		t.Fatalf("mounting a tmpfs as root: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(src, syscall.MNT_DETACH) })
	mnt := testMount(t, newFS(t, src, writable(dcpwrite.Target{WorldSize: 2})))
	dir, back := filepath.Join(mnt, "new"), filepath.Join(src, "new")
	require.NoError(t, os.Mkdir(dir, 0o755))
	small := filepath.Join(t.TempDir(), "small.safetensors")
	writeST(t, small, 5, tspec{"small", safetensors.F32, []int64{100}})
	smallData, err := os.ReadFile(small)
	require.NoError(t, err)
	require.NoError(t, writeFile(t, filepath.Join(dir, "small.safetensors"), smallData))
	meta, err := os.ReadFile(filepath.Join(back, ".metadata"))
	require.NoError(t, err)
	before := shardFiles(t, back)

	// fits in the spool, not twice
	big := filepath.Join(t.TempDir(), "big.safetensors")
	writeST(t, big, 6, tspec{"big", safetensors.F32, []int64{400, 1024}}) // 1.6 MB
	bigData, err := os.ReadFile(big)
	require.NoError(t, err)
	require.ErrorIs(t, writeFile(t, filepath.Join(dir, "big.safetensors"), bigData), syscall.EIO)
	got, err := os.ReadFile(filepath.Join(back, ".metadata"))
	require.NoError(t, err)
	require.Equal(t, meta, got)
	require.Equal(t, before, shardFiles(t, back))
	require.Empty(t, spoolFiles(t, back))

	// does not even fit in the spool: write(2) says so
	huge := bytes.Repeat([]byte{1}, 4<<20)
	f, err := os.Create(filepath.Join(dir, "huge.safetensors"))
	require.NoError(t, err)
	_, err = f.Write(huge)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.ErrorIs(t, f.Close(), syscall.EIO)
	require.Empty(t, spoolFiles(t, back))

	// space is back: a small file still commits
	other := filepath.Join(t.TempDir(), "other.safetensors")
	writeST(t, other, 7, tspec{"other", safetensors.F32, []int64{100}})
	otherData, err := os.ReadFile(other)
	require.NoError(t, err)
	require.NoError(t, writeFile(t, filepath.Join(dir, "other.safetensors"), otherData))
	require.Len(t, readTensors(t, dir), 2)
}

// TestWriteConcurrentFiles: files written in parallel all commit.
func TestWriteConcurrentFiles(t *testing.T) {
	src := t.TempDir()
	mnt := testMount(t, newFS(t, src, writable(dcpwrite.Target{WorldSize: 3})))
	dir := filepath.Join(mnt, "new")
	require.NoError(t, os.Mkdir(dir, 0o755))
	in := t.TempDir()
	want := map[string][]byte{}
	var names []string
	for i := 0; i < 8; i++ {
		name := "w" + string(rune('a'+i))
		p := filepath.Join(in, name+".safetensors")
		for k, v := range writeST(t, p, int64(10+i), tspec{name + ".weight", safetensors.F32, []int64{int64(17 + i), 33}}) {
			want[k] = v
		}
		names = append(names, p)
	}
	errs := make(chan error, len(names))
	for _, p := range names {
		go func(p string) {
			out, err := exec.Command("cp", p, dir).CombinedOutput()
			if err != nil {
				err = &os.PathError{Op: "cp " + string(out), Path: p, Err: err}
			}
			errs <- err
		}(p)
	}
	for range names {
		require.NoError(t, <-errs)
	}
	require.Equal(t, want, readTensors(t, dir))
	var n int
	for _, f := range listDir(t, filepath.Join(src, "new")) {
		if _, _, ok := torchdcp.ParseShardName(f); ok {
			n++
		}
	}
	require.Equal(t, 8*3, n)
}

// TestWriteOneWriter: while a file is open for writing, another open of it
// for writing is EBUSY, and the first writer's close commits exactly its
// own bytes (issue 22: two writers' tensors were committed as one file and
// the first close returned 0). An open for writing right after a close
// still works, whatever the kernel's release of the closed file is doing.
func TestWriteOneWriter(t *testing.T) {
	src := t.TempDir()
	mnt := testMount(t, newFS(t, src, writable(dcpwrite.Target{WorldSize: 2})))
	dir, back := filepath.Join(mnt, "new"), filepath.Join(src, "new")
	require.NoError(t, os.Mkdir(dir, 0o755))
	in := t.TempDir()
	wantA := writeST(t, filepath.Join(in, "a.safetensors"), 21, llamaA...)
	writeST(t, filepath.Join(in, "b.safetensors"), 22, llamaA...) // the same tensors, other bytes
	a, err := os.ReadFile(filepath.Join(in, "a.safetensors"))
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(in, "b.safetensors"))
	require.NoError(t, err)
	name := filepath.Join(dir, "model.safetensors")

	fa, err := os.Create(name)
	require.NoError(t, err)
	defer fa.Close()
	half := len(a) / 2
	_, err = fa.Write(a[:half])
	require.NoError(t, err)
	for _, flag := range []int{os.O_WRONLY | os.O_CREATE | os.O_TRUNC, os.O_RDWR} {
		fb, err := os.OpenFile(name, flag, 0o644)
		if err == nil {
			fb.WriteAt(b, 0)
			fb.Close()
		}
		require.ErrorIs(t, err, syscall.EBUSY, "flags %#o", flag)
	}
	r, err := os.Open(name)
	require.NoError(t, err, "a reader is not a writer")
	require.NoError(t, r.Close())
	_, err = fa.Write(a[half:])
	require.NoError(t, err)
	require.NoError(t, fa.Close())
	require.Equal(t, wantA, readTensors(t, dir))
	require.Empty(t, spoolFiles(t, back))

	// touch, then write: the second open finds the first one's file, or
	// what its release made of it (an empty tensor file is dropped).
	for i := range 10 {
		for _, n := range []string{"notes" + strconv.Itoa(i) + ".txt", "t" + strconv.Itoa(i) + ".safetensors"} {
			p := filepath.Join(dir, n)
			f, err := os.Create(p)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			data := []byte("notes")
			if filepath.Ext(n) == ".safetensors" {
				data = oneTensorFile(t, "t"+strconv.Itoa(i))
			}
			require.NoError(t, os.WriteFile(p, data, 0o644), n)
		}
		got, err := os.ReadFile(filepath.Join(dir, "notes"+strconv.Itoa(i)+".txt"))
		require.NoError(t, err)
		require.Equal(t, "notes", string(got))
	}
	require.Len(t, readTensors(t, dir), len(llamaA)+10)
	require.Empty(t, spoolFiles(t, back))
}

// oneTensorFile returns a safetensors file of one tensor, name.
func oneTensorFile(t *testing.T, name string) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "good.safetensors")
	writeST(t, p, 9, tspec{name, safetensors.F32, []int64{3}})
	data, err := os.ReadFile(p)
	require.NoError(t, err)
	return data
}

// TestWriteNameTooLong: a name over NAME_MAX fails where it is created,
// with ENAMETOOLONG, not at close; nothing is left behind.
func TestWriteNameTooLong(t *testing.T) {
	src := t.TempDir()
	mnt := testMount(t, newFS(t, src, writable(dcpwrite.Target{WorldSize: 2})))
	dir, back := filepath.Join(mnt, "new"), filepath.Join(src, "new")
	require.NoError(t, os.Mkdir(dir, 0o755))
	before := listDir(t, back)
	for _, n := range []string{strings.Repeat("c", 251) + ".json", strings.Repeat("m", 244) + ".safetensors"} {
		require.Len(t, n, 256)
		f, err := os.Create(filepath.Join(dir, n))
		if err == nil {
			f.Close()
		}
		require.ErrorIs(t, err, syscall.ENAMETOOLONG, n)
	}
	require.ErrorIs(t, os.Mkdir(filepath.Join(dir, strings.Repeat("d", 256)), 0o755), syscall.ENAMETOOLONG)
	_, err := os.Stat(filepath.Join(dir, strings.Repeat("s", 256)))
	require.ErrorIs(t, err, syscall.ENAMETOOLONG, "a lookup, not only a create")
	require.Empty(t, listDir(t, dir))
	require.Equal(t, before, listDir(t, back), "no spool, no debris")

	// nor can a file being written be renamed to one
	f, err := os.Create(filepath.Join(dir, "x.tmp"))
	require.NoError(t, err)
	require.ErrorIs(t, os.Rename(filepath.Join(dir, "x.tmp"), filepath.Join(dir, strings.Repeat("r", 256))), syscall.ENAMETOOLONG)
	require.NoError(t, f.Close())
	require.NoError(t, os.Remove(filepath.Join(dir, "x.tmp")))
	require.Empty(t, listDir(t, dir))
	require.Empty(t, spoolFiles(t, back))
}

// TestWriteLimitsPerMount: the write targets of a mount share one bound on
// write-behind buffers and reshards, and two mounts in one process do not.
func TestWriteLimitsPerMount(t *testing.T) {
	a := newFS(t, t.TempDir(), writable(dcpwrite.Target{}))
	b := newFS(t, t.TempDir(), writable(dcpwrite.Target{}))
	require.NotNil(t, a.limits)
	require.NotSame(t, a.limits, b.limits)
	assert.Nil(t, newFS(t, t.TempDir()).limits, "a read-only mount writes nothing")
}
