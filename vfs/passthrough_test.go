package vfs

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A file outside any checkpoint goes to the kernel as a passthrough backing
// file: reads and mappings never reach ckptfs. The kernel grants
// passthrough to root only, and ckptfs offers it on the filesystems listed
// in backingFS; elsewhere ckptfs serves the reads itself.
func TestOtherFilesArePassedThrough(t *testing.T) {
	src := t.TempDir()
	want := make([]byte, 4<<20+123)
	for i := range want {
		want[i] = byte(i * 13)
	}
	require.NoError(t, os.WriteFile(filepath.Join(src, "data.bin"), want, 0o644))
	fsys := newFS(t, src)
	mnt := testMount(t, fsys)
	path := filepath.Join(mnt, "data.bin")

	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "read")
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, len(want), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	mapped := bytes.Equal(want, m)
	require.NoError(t, unix.Munmap(m))
	require.True(t, mapped, "mapped")

	if passthroughHere(t, src) {
		require.Zero(t, fsys.Stats().PassBytesServed, "the kernel read the file itself")
	} else {
		require.Positive(t, fsys.Stats().PassBytesServed, "served by ckptfs without passthrough")
	}
}

// passthroughHere says whether the kernel grants passthrough for files in
// dir: to root, on a filesystem it stacks on.
func passthroughHere(t *testing.T, dir string) bool {
	d, err := os.Open(dir)
	require.NoError(t, err)
	defer d.Close()
	return os.Geteuid() == 0 && takesBacking(int(d.Fd()))
}

// A file replaced under its name (a rename over it) while an open of the
// old one is still passed through: a new open reads the new file.
func TestReplacedPlainFileIsNotServedFromTheOldOne(t *testing.T) {
	src := t.TempDir()
	name := filepath.Join(src, "notes.txt")
	require.NoError(t, os.WriteFile(name, []byte("old content\n"), 0o644))
	mnt := testMount(t, newFS(t, src))
	path := filepath.Join(mnt, "notes.txt")

	old, err := os.Open(path)
	require.NoError(t, err)
	defer old.Close()
	buf := make([]byte, 64)
	n, err := old.ReadAt(buf, 0)
	require.ErrorIs(t, err, io.EOF)
	require.Equal(t, "old content\n", string(buf[:n]))

	tmp := filepath.Join(src, ".notes.tmp")
	require.NoError(t, os.WriteFile(tmp, []byte("the new one, longer\n"), 0o644))
	require.NoError(t, os.Rename(tmp, name))

	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "the new one, longer\n", string(got))
	n, err = old.ReadAt(buf, 0)
	require.ErrorIs(t, err, io.EOF)
	require.Equal(t, "old content\n", string(buf[:n]), "the open from before reads what it opened")
}

// A source tree can reach into another filesystem whose files the kernel
// does not take as backing files (here a FUSE mount, too deep to stack on).
// go-fuse stops using passthrough for the whole mount after one refusal,
// and the kernel then fails (EIO) any further open of a file that other
// opens hold in passthrough: such files are never offered.
func TestPassthroughIsOfferedOnlyWhereTheKernelTakesIt(t *testing.T) {
	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "a.txt"), []byte("on ext4\n"), 0o644))
	inner := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(inner, "b.txt"), []byte("through another mount\n"), 0o644))
	sub := filepath.Join(src, "sub")
	require.NoError(t, os.Mkdir(sub, 0o755))
	server, err := Mount(sub, newFS(t, inner), MountOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, server.Unmount()) })
	fsys := newFS(t, src)
	mnt := testMount(t, fsys)

	held, err := os.Open(filepath.Join(mnt, "a.txt"))
	require.NoError(t, err)
	defer held.Close()
	got, err := os.ReadFile(filepath.Join(mnt, "sub", "b.txt"))
	require.NoError(t, err)
	require.Equal(t, "through another mount\n", string(got))
	got, err = os.ReadFile(filepath.Join(mnt, "a.txt"))
	require.NoError(t, err, "a second open of a file held in passthrough")
	require.Equal(t, "on ext4\n", string(got))
	if passthroughHere(t, src) { // a.txt passed through, b.txt served by ckptfs
		require.Equal(t, int64(len("through another mount\n")), fsys.Stats().PassBytesServed)
	}
}
