package vfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/cache"
	"github.com/ckptfs/ckptfs/internal/testenv"
	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/export"
	"github.com/ckptfs/ckptfs/layout/source/open"
	"github.com/ckptfs/ckptfs/layout/view"
)

// fixture returns a torch-written checkpoint case from testdata.
func fixture(t *testing.T, name string) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "testdata", name))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "ckpt"))
	require.NoError(t, err, "fixture %s missing: run make fixtures", name)
	return dir
}

// copyTree copies a fixture so a test may damage it.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "src")
	require.NoError(t, os.CopyFS(dst, os.DirFS(src)))
	return dst
}

func newFS(t *testing.T, src string, opts ...func(*Options)) *FS {
	t.Helper()
	c, err := cache.New(cache.Options{Size: 64 << 20, BlockSize: 1 << 20, ReadAhead: 2})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	o := Options{Cache: c, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, f := range opts {
		f(&o)
	}
	if o.Tree == nil {
		s, err := open.Open(context.Background(), src, "", open.Options{Writable: o.Writable})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() }) // after the FS: cleanups run last first
		o.Tree, err = s.Dir()
		require.NoError(t, err)
	}
	fsys, err := New(o)
	require.NoError(t, err)
	t.Cleanup(fsys.Close)
	return fsys
}

// readModes are the two ways a view file of a local source is read.
var readModes = []struct {
	name   string
	direct bool
}{{"block cache", false}, {"direct", true}}

// readMode sets DirectReads.
func readMode(direct bool) func(*Options) { return func(o *Options) { o.DirectReads = direct } }

// testMount mounts fsys in a temp dir, unmounted at cleanup. FUSE debug
// output only under -v.
func testMount(t *testing.T, fsys *FS) string {
	t.Helper()
	mnt := t.TempDir()
	server, err := Mount(mnt, fsys, MountOptions{Debug: testing.Verbose() && os.Getenv("FUSE_DEBUG") != ""})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, server.Unmount()) })
	return mnt
}

// exported writes the reference export of a checkpoint.
func exported(t *testing.T, ckptDir string) string {
	t.Helper()
	c, err := layout.Open(ckptDir)
	require.NoError(t, err)
	defer c.Close()
	v, err := view.Plan(c, view.Options{})
	require.NoError(t, err)
	out := filepath.Join(t.TempDir(), "export")
	require.NoError(t, export.Write(context.Background(), v, out, export.Options{}))
	return out
}

// requireSameFiles checks that dirs want and got list the same files, with
// the same bytes.
func requireSameFiles(t *testing.T, want, got string) {
	t.Helper()
	require.Equal(t, listDir(t, want), listDir(t, got))
	for _, f := range listDir(t, want) {
		a, err := os.ReadFile(filepath.Join(want, f))
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(got, f))
		require.NoError(t, err)
		require.True(t, bytes.Equal(a, b), filepath.Join(got, f))
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func TestNodesWithoutMount(t *testing.T) {
	fsys := newFS(t, fixture(t, "sample"))
	root := fsys.Root()
	fs.NewNodeFS(root, &fs.Options{})
	ctx := context.Background()
	var out fuse.EntryOut
	ckpt, errno := root.Lookup(ctx, "ckpt", &out)
	require.Equal(t, syscall.Errno(0), errno)
	require.True(t, ckpt.IsDir())
	dir := ckpt.Operations().(*Dir)
	_, errno = dir.Lookup(ctx, ".metadata", &out)
	require.Equal(t, syscall.ENOENT, errno, "DCP internals are hidden in a view")
	st, errno := dir.Lookup(ctx, "model.safetensors", &out)
	require.Equal(t, syscall.Errno(0), errno)
	require.NotZero(t, out.Attr.Size)
	fh, _, errno := st.Operations().(*ViewFile).Open(ctx, syscall.O_RDONLY)
	require.Equal(t, syscall.Errno(0), errno)
	buf := make([]byte, 8)
	res, errno := fh.(fs.FileReader).Read(ctx, buf, 0)
	require.Equal(t, syscall.Errno(0), errno)
	head, _ := res.Bytes(buf)
	want, err := os.ReadFile(filepath.Join(exported(t, filepath.Join(fixture(t, "sample"), "ckpt")), "model.safetensors"))
	require.NoError(t, err)
	require.Equal(t, want[:8], head)
	fh.(fs.FileReleaser).Release(ctx)
	_, _, errno = st.Operations().(*ViewFile).Open(ctx, syscall.O_RDWR)
	require.Equal(t, syscall.EROFS, errno)
}

func TestMountEqualsExport(t *testing.T) {
	for _, mode := range readModes {
		for _, name := range []string{"sample", "fsdp2_4ranks", "tp_shard1", "mesh2d", "dtypes", "nested_optim", "hf_sharded"} {
			t.Run(mode.name+"/"+name, func(t *testing.T) { testMountEqualsExport(t, name, mode.direct) })
		}
	}
}

func testMountEqualsExport(t *testing.T, name string, direct bool) {
	src := fixture(t, name)
	ref := exported(t, filepath.Join(src, "ckpt"))
	fsys := newFS(t, src, readMode(direct))
	mnt := testMount(t, fsys)
	view := filepath.Join(mnt, "ckpt")
	requireSameFiles(t, ref, view) // read(2) of each whole file
	rng := rand.New(rand.NewSource(1))
	for _, f := range listDir(t, ref) {
		want, err := os.ReadFile(filepath.Join(ref, f))
		require.NoError(t, err)
		// pread at random offsets
		fd, err := os.Open(filepath.Join(view, f))
		require.NoError(t, err)
		for i := 0; i < 50 && len(want) > 0; i++ {
			off := rng.Intn(len(want))
			n := 1 + rng.Intn(min(len(want)-off, 300_000))
			buf := make([]byte, n)
			_, err := fd.ReadAt(buf, int64(off))
			require.NoError(t, err)
			require.True(t, bytes.Equal(want[off:off+n], buf), "%s pread [%d,+%d)", f, off, n)
		}
		// mmap, the way safetensors reads
		if len(want) > 0 {
			m, err := syscall.Mmap(int(fd.Fd()), 0, len(want), syscall.PROT_READ, syscall.MAP_SHARED)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, m), "%s mmap", f)
			require.NoError(t, syscall.Munmap(m))
		}
		fi, err := fd.Stat()
		require.NoError(t, err)
		require.Equal(t, int64(len(want)), fi.Size())
		require.Equal(t, (int64(len(want))+511)/512, fi.Sys().(*syscall.Stat_t).Blocks)
		require.NoError(t, fd.Close())
	}
	// Direct reads leave the block cache alone.
	if st := fsys.Stats(); direct {
		require.Zero(t, st.Cache.Fills)
		require.Zero(t, st.Cache.Misses)
	} else {
		require.Positive(t, st.Cache.Fills)
	}
}

// TestConcurrentRandomReaders: 64 readers of one view file at random
// offsets get its bytes. With a cache of a few small blocks and O_DIRECT
// opens (every read reaches ckptfs), blocks are evicted and their buffers
// reused while replies written from them are in flight: with
// CKPTFS_DEBUG_POISON set (make test), a reply written from a buffer after
// its block's last release would show as wrong bytes.
func TestConcurrentRandomReaders(t *testing.T) {
	src := fixture(t, "sample")
	ref := exported(t, filepath.Join(src, "ckpt"))
	want, err := os.ReadFile(filepath.Join(ref, "model.safetensors"))
	require.NoError(t, err)
	tiny := func(o *Options) {
		c, err := cache.New(cache.Options{Size: 16 << 10, BlockSize: 4 << 10, ReadAhead: 2, Staging: 1, MaxFills: 2})
		require.NoError(t, err)
		t.Cleanup(c.Close)
		o.Cache = c
	}
	for _, tc := range []struct {
		name  string
		opts  []func(*Options)
		flags int
	}{
		{"default", nil, 0},
		{"churning cache, O_DIRECT", []func(*Options){tiny}, syscall.O_DIRECT},
		{"direct reads, O_DIRECT", []func(*Options){readMode(true)}, syscall.O_DIRECT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys := newFS(t, src, tc.opts...)
			mnt := testMount(t, fsys)
			path := filepath.Join(mnt, "ckpt", "model.safetensors")
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for r := 0; r < 64; r++ {
				wg.Add(1)
				go func(seed int64) {
					defer wg.Done()
					rng := rand.New(rand.NewSource(seed))
					fd, err := os.OpenFile(path, os.O_RDONLY|tc.flags, 0)
					if err != nil {
						errs <- err
						return
					}
					defer fd.Close()
					for i := 0; i < 20; i++ {
						off := rng.Intn(len(want))
						n := 1 + rng.Intn(min(len(want)-off, 1<<20))
						buf := make([]byte, n)
						if _, err := fd.ReadAt(buf, int64(off)); err != nil {
							errs <- err
							return
						}
						if !bytes.Equal(buf, want[off:off+n]) {
							errs <- fmt.Errorf("wrong bytes at [%d, %d)", off, off+n)
							return
						}
					}
				}(int64(r))
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			if st := fsys.Stats().Cache; fsys.reads.Direct() {
				assert.Zero(t, st.Fills)
			} else if tc.flags != 0 {
				assert.Positive(t, st.BuffersReused, "blocks churned: %+v", st)
			}
		})
	}
}

func TestTruncatedSourceGivesEIO(t *testing.T) {
	src := copyTree(t, fixture(t, "fsdp2_4ranks"))
	mnt := testMount(t, newFS(t, src))
	view := filepath.Join(mnt, "ckpt")
	require.Contains(t, listDir(t, view), "model.safetensors")
	shards, err := filepath.Glob(filepath.Join(src, "ckpt", "*.distcp"))
	require.NoError(t, err)
	for _, s := range shards {
		require.NoError(t, os.Truncate(s, 100))
	}
	_, err = os.ReadFile(filepath.Join(view, "model.safetensors"))
	require.ErrorIs(t, err, syscall.EIO)
}

func TestSourceReplacedGivesEIO(t *testing.T) {
	src := copyTree(t, fixture(t, "fsdp2_4ranks"))
	mnt := testMount(t, newFS(t, src))
	view := filepath.Join(mnt, "ckpt")
	require.Contains(t, listDir(t, view), "model.safetensors")
	shards, err := filepath.Glob(filepath.Join(src, "ckpt", "*.distcp"))
	require.NoError(t, err)
	for _, s := range shards {
		data, err := os.ReadFile(s)
		require.NoError(t, err)
		require.NoError(t, os.Remove(s))
		require.NoError(t, os.WriteFile(s, data, 0o644)) // same bytes, new file
	}
	_, err = os.ReadFile(filepath.Join(view, "model.safetensors"))
	require.ErrorIs(t, err, syscall.EIO)
}

// A shard rewritten in place with the same size and its mtime put back
// (rsync --inplace -t) is caught through ctime: bytes already cached are
// not served to a new open, and an uncached read through an open handle
// fails, never mixing old and new bytes.
func TestInPlaceRewriteGivesEIO(t *testing.T) {
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) { testInPlaceRewriteGivesEIO(t, mode.direct) })
	}
}

func testInPlaceRewriteGivesEIO(t *testing.T, direct bool) {
	src := copyTree(t, fixture(t, "fsdp2_4ranks"))
	mnt := testMount(t, newFS(t, src, readMode(direct)))
	path := filepath.Join(mnt, "ckpt", "model.safetensors")
	before, err := os.ReadFile(path) // fills the block cache
	require.NoError(t, err)
	held, err := os.Open(path)
	require.NoError(t, err)
	defer held.Close()
	// Every read of an O_DIRECT open reaches ckptfs.
	uncached, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0)
	require.NoError(t, err)
	defer uncached.Close()

	shards, err := filepath.Glob(filepath.Join(src, "ckpt", "*.distcp"))
	require.NoError(t, err)
	for _, s := range shards {
		fi, err := os.Stat(s)
		require.NoError(t, err)
		data, err := os.ReadFile(s)
		require.NoError(t, err)
		data[len(data)/2] ^= 0xff
		f, err := os.OpenFile(s, os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = f.WriteAt(data, 0)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		require.NoError(t, os.Chtimes(s, fi.ModTime(), fi.ModTime()))
	}
	_, err = os.Open(path)
	require.ErrorIs(t, err, syscall.EIO, "a new open sees the change")
	// An open handle gets the old bytes (all cached here) or EIO, never a mix.
	got := make([]byte, len(before))
	if _, err := held.ReadAt(got, 0); err == nil {
		require.Equal(t, before, got)
	} else {
		require.ErrorIs(t, err, syscall.EIO)
	}
	if direct { // no block holds the old bytes
		_, err = uncached.ReadAt(make([]byte, 1<<20), 0)
		require.ErrorIs(t, err, syscall.EIO)
	}
	// A fresh mount is a snapshot of the new content.
	_, err = os.ReadFile(filepath.Join(testMount(t, newFS(t, src)), "ckpt", "model.safetensors"))
	require.NoError(t, err)
}

func TestTrainingRootShowsThrough(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.CopyFS(filepath.Join(root, "step_1"), os.DirFS(filepath.Join(fixture(t, "sample"), "ckpt"))))
	require.NoError(t, os.Symlink("step_1", filepath.Join(root, "latest")))
	require.NoError(t, os.WriteFile(filepath.Join(root, "notes.txt"), []byte("hi"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(root, "step_2"), 0o755)) // being written: no .metadata yet
	fsys := newFS(t, root)
	mnt := testMount(t, fsys)
	require.Equal(t, []string{".ckptfs", "latest", "notes.txt", "step_1", "step_2"}, listDir(t, mnt))
	require.Equal(t, listDir(t, filepath.Join(mnt, "step_1")), listDir(t, filepath.Join(mnt, "latest")))
	require.Empty(t, listDir(t, filepath.Join(mnt, "step_2")))
	// step_2 completes after it was listed: it becomes a view within the
	// second a negative detection is trusted
	require.NoError(t, os.CopyFS(filepath.Join(root, "step_2"), os.DirFS(filepath.Join(fixture(t, "sample"), "ckpt"))))
	require.Eventually(t, func() bool {
		return slices.Contains(listDir(t, filepath.Join(mnt, "step_2")), "model.safetensors")
	}, 5*time.Second, 50*time.Millisecond)
	got, err := os.ReadFile(filepath.Join(mnt, "notes.txt"))
	require.NoError(t, err)
	require.Equal(t, "hi", string(got))
	stats, err := os.ReadFile(filepath.Join(mnt, ".ckptfs"))
	require.NoError(t, err)
	require.Contains(t, string(stats), `"bytes_served"`)
	require.Len(t, fsys.Stats().Views, 2, "latest and step_1 share one view")
}

func TestBrokenCheckpointShowsError(t *testing.T) {
	src := copyTree(t, fixture(t, "sample"))
	require.NoError(t, os.WriteFile(filepath.Join(src, "ckpt", ".metadata"), []byte("not a pickle"), 0o644))
	mnt := testMount(t, newFS(t, src))
	names := listDir(t, filepath.Join(mnt, "ckpt"))
	require.Contains(t, names, errorName)
	msg, err := os.ReadFile(filepath.Join(mnt, "ckpt", errorName))
	require.NoError(t, err)
	require.Contains(t, string(msg), ".metadata")
}

func TestSeekDataHole(t *testing.T) {
	mnt := testMount(t, newFS(t, fixture(t, "sample")))
	fd, err := os.Open(filepath.Join(mnt, "ckpt", "model.safetensors"))
	require.NoError(t, err)
	defer fd.Close()
	fi, err := fd.Stat()
	require.NoError(t, err)
	off, err := fd.Seek(10, unix.SEEK_DATA)
	require.NoError(t, err)
	require.Equal(t, int64(10), off)
	off, err = fd.Seek(10, unix.SEEK_HOLE)
	require.NoError(t, err)
	require.Equal(t, fi.Size(), off)
}

func TestMountPointInsideSourceIsHidden(t *testing.T) {
	src := copyTree(t, fixture(t, "sample"))
	mnt := filepath.Join(src, "mnt")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	fsys := newFS(t, src)
	server, err := Mount(mnt, fsys, MountOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, server.Unmount()) })
	// (expected.safetensors is a tensor file no reader takes: noted.)
	require.Equal(t, []string{".ckptfs", infoName, "case.json", "ckpt", "expected.safetensors"}, listDir(t, mnt))
}

// The mount shows nothing from outside its source: links that leave it are
// not listed and cannot be looked up, links inside work (`latest`), and a
// FIFO planted in a checkpoint neither hangs a listing nor shows.
func TestMountStaysInsideSource(t *testing.T) {
	top := t.TempDir()
	secret := filepath.Join(top, "secret")
	require.NoError(t, os.MkdirAll(secret, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(secret, "passwd"), []byte("root:x"), 0o600))
	src := filepath.Join(top, "src")
	require.NoError(t, os.CopyFS(filepath.Join(src, "step_1"), os.DirFS(filepath.Join(fixture(t, "sample"), "ckpt"))))
	require.NoError(t, os.Symlink("step_1", filepath.Join(src, "latest")))
	require.NoError(t, os.Symlink(secret, filepath.Join(src, "etc")))
	require.NoError(t, os.Symlink("../../secret/passwd", filepath.Join(src, "step_1", "tokenizer.json")))
	require.NoError(t, os.Symlink(filepath.Join(secret, "passwd"), filepath.Join(src, "step_1", "notes.txt")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(src, "step_1", "generation_config.json"), 0o644))

	mnt := testMount(t, newFS(t, src))
	done := make(chan []string)
	go func() { done <- listDir(t, filepath.Join(mnt, "step_1")) }()
	select {
	case names := <-done:
		require.Equal(t, []string{"config.json", "model.safetensors", "model.safetensors.index.json"}, names)
	case <-time.After(10 * time.Second):
		t.Fatal("listing a checkpoint with a FIFO in it hung")
	}
	require.Equal(t, []string{".ckptfs", "latest", "step_1"}, listDir(t, mnt))
	for _, p := range []string{"etc/passwd", "step_1/tokenizer.json", "step_1/notes.txt"} {
		_, err := os.ReadFile(filepath.Join(mnt, p))
		require.True(t, errors.Is(err, os.ErrNotExist), "%s: %v", p, err)
	}
	a, err := os.ReadFile(filepath.Join(mnt, "latest", "model.safetensors"))
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(mnt, "step_1", "model.safetensors"))
	require.NoError(t, err)
	require.Equal(t, a, b)
}

// The kernel may read a view as far ahead as asked (read_ahead_kb) with as
// many requests in the background as that takes (max_background): at
// go-fuse's 12, a read-ahead window past 12 MiB stalled every reader.
func TestMountReadAheadAndBackground(t *testing.T) {
	testenv.RequireSystem(t, os.Geteuid() == 0, "root (read_ahead_kb and fusectl are root's)")
	mnt := t.TempDir()
	server, err := Mount(mnt, newFS(t, fixture(t, "sample")), MountOptions{ReadAheadKB: DefaultReadAhead >> 10})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, server.Unmount()) })

	ra, err := bdiReadAhead(mnt)
	require.NoError(t, err)
	got, err := os.ReadFile(ra)
	require.NoError(t, err)
	assert.Equal(t, "8192", strings.TrimSpace(string(got)))

	var st unix.Stat_t
	require.NoError(t, unix.Stat(mnt, &st))
	ctl := fmt.Sprintf("/sys/fs/fuse/connections/%d", unix.Minor(st.Dev))
	if _, err := os.Stat(ctl); err != nil {
		_ = unix.Mount("fusectl", "/sys/fs/fuse/connections", "fusectl", 0, "")
	}
	got, err = os.ReadFile(ctl + "/max_background")
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(maxBackground), strings.TrimSpace(string(got)))
}

// The read-ahead of a source's disk is read from sysfs as the kernel lays
// it out: /sys/dev/block/MAJ:MIN links to the device, a partition's inside
// its disk's directory, whose queue holds read_ahead_kb.
func TestBlockReadAhead(t *testing.T) {
	sysfs := t.TempDir()
	disk := filepath.Join(sysfs, "devices", "pci0000:00", "block", "nvme0n1")
	require.NoError(t, os.MkdirAll(filepath.Join(disk, "queue"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(disk, "queue", "read_ahead_kb"), []byte("8192\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(disk, "nvme0n1p1"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(disk, "nvme0n1p1", "partition"), []byte("1\n"), 0o644))
	dm := filepath.Join(sysfs, "devices", "virtual", "block", "dm-0")
	require.NoError(t, os.MkdirAll(filepath.Join(dm, "queue"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dm, "queue", "read_ahead_kb"), []byte("128\n"), 0o644))
	links := filepath.Join(sysfs, "dev", "block")
	require.NoError(t, os.MkdirAll(links, 0o755))
	for link, target := range map[string]string{"259:0": disk, "259:1": filepath.Join(disk, "nvme0n1p1"), "253:0": dm} {
		rel, err := filepath.Rel(links, target)
		require.NoError(t, err)
		require.NoError(t, os.Symlink(rel, filepath.Join(links, link)))
	}
	for _, tc := range []struct {
		major, minor uint32
		want         int64
		ok           bool
	}{
		{259, 0, 8 << 20, true},   // a disk
		{259, 1, 8 << 20, true},   // a partition: its disk's
		{253, 0, 128 << 10, true}, // device mapper: its own queue
		{0, 42, 0, false},         // tmpfs, overlay: no block device
	} {
		got, ok := blockReadAhead(sysfs, tc.major, tc.minor)
		assert.Equal(t, tc.ok, ok, "%d:%d", tc.major, tc.minor)
		assert.Equal(t, tc.want, got, "%d:%d", tc.major, tc.minor)
	}
}

// TestUnrecognisedTensorFilesAreNoted: a directory holding tensor files no
// reader takes shows them as they are, beside a CKPTFS_INFO.txt naming them
// and the readers tried, logged once; inspect's error is that same line. A
// directory without tensor files (a training root) gets no note.
func TestUnrecognisedTensorFilesAreNoted(t *testing.T) {
	root := t.TempDir()
	loose := filepath.Join(root, "loose")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "plain"), 0o755))
	require.NoError(t, os.MkdirAll(loose, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(loose, "weights.pt"), []byte("not a zip"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(loose, "__0_0.distcp"), []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "plain", "notes.txt"), []byte("hi"), 0o644))
	logs := &logLines{}
	fsys := newFS(t, root, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logs.buf, nil)) })
	mnt := testMount(t, fsys)

	// A lookup of the note alone, before any listing, finds it.
	msg, err := os.ReadFile(filepath.Join(mnt, "loose", infoName))
	require.NoError(t, err)
	require.Equal(t, []string{infoName, "__0_0.distcp", "weights.pt"}, listDir(t, filepath.Join(mnt, "loose")))
	listDir(t, filepath.Join(mnt, "loose"))
	// The note is readable by whom the directory is (it showed mode 0).
	info, err := os.Stat(filepath.Join(mnt, "loose", infoName))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o444), info.Mode().Perm(), "the note's mode follows its 0755 directory")
	for _, want := range []string{loose, "__0_0.distcp, weights.pt", "torch-dcp (a DCP .metadata)", "pytorch_model.bin"} {
		require.Contains(t, string(msg), want)
	}
	lines := logs.lines()
	require.Len(t, lines, 1, "one log line per directory")
	require.Contains(t, lines[0], "weights.pt")
	require.Equal(t, []string{"notes.txt"}, listDir(t, filepath.Join(mnt, "plain")))
	_, err = os.Stat(filepath.Join(mnt, "plain", infoName))
	require.ErrorIs(t, err, os.ErrNotExist)

	_, err = layout.Open(loose)
	require.Error(t, err)
	require.Equal(t, "layout: "+strings.TrimSpace(string(msg)), err.Error())
}
