package vfs

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/safetensors"
)

// alignedBuf is n bytes at a 4 KiB-aligned address, as O_DIRECT wants them.
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := int(4096 - uintptr(unsafe.Pointer(&b[0]))%4096)
	return b[off%4096 : off%4096+n]
}

// blockAligned pads the header of safetensors file st with spaces (as the
// format allows) so that the file is whole 4 KiB blocks: one O_DIRECT write.
func blockAligned(st []byte) []byte {
	hlen := binary.LittleEndian.Uint64(st)
	header, data := st[8:8+hlen], st[8+hlen:]
	pad := (4096 - (8+len(header)+len(data))%4096) % 4096
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)+pad))
	out = append(append(out, header...), bytes.Repeat([]byte(" "), pad)...)
	return append(out, data...)
}

// TestDirectIOSentAtOnce: with AsyncDIO, an O_DIRECT read of a view file
// larger than one request (1 MiB) reaches the mount as several requests in
// flight at once,
// as Run:ai Model Streamer reads (io_uring, O_DIRECT), not one request after
// the reply to the last; its bytes are the file's. The file is written
// through a writable mount with one O_DIRECT write, whose requests may
// arrive in any order.
func TestDirectIOSentAtOnce(t *testing.T) {
	in := filepath.Join(t.TempDir(), "model.safetensors")
	tensors := writeST(t, in, 3, tspec{"model.embed_tokens.weight", safetensors.F32, []int64{1536, 1024}}, // 6 MiB
		tspec{"model.norm.weight", safetensors.F32, []int64{1024}})
	st, err := os.ReadFile(in)
	require.NoError(t, err)
	want := blockAligned(st)

	src := t.TempDir()
	wmnt := t.TempDir()
	wserver, err := Mount(wmnt, newFS(t, src, writable(dcpwrite.Target{WorldSize: 2})), MountOptions{AsyncDIO: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, wserver.Unmount()) })
	dir := filepath.Join(wmnt, "big")
	require.NoError(t, os.Mkdir(dir, 0o755))
	f, err := os.OpenFile(filepath.Join(dir, "model.safetensors"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_DIRECT, 0o644)
	require.NoError(t, err)
	buf := alignedBuf(len(want))
	copy(buf, want)
	n, err := f.Write(buf)
	require.NoError(t, err)
	require.Equal(t, len(want), n)
	require.NoError(t, f.Close())

	// A read-only mount of what was written, whose reads wait (up to a
	// bound far above a loaded machine's) until a second read has arrived.
	var armed atomic.Bool
	var reads atomic.Int32
	second := make(chan struct{})
	var together atomic.Bool
	mnt := t.TempDir()
	server, err := Mount(mnt, newFS(t, src), MountOptions{AsyncDIO: true, ObserveOp: func(op string, _ time.Duration, _ syscall.Errno) {
		if op != "read" || !armed.Load() {
			return
		}
		switch reads.Add(1) {
		case 1:
			select {
			case <-second:
				together.Store(true)
			case <-time.After(30 * time.Second):
			}
		case 2:
			close(second)
		}
	}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, server.Unmount()) })

	require.Equal(t, tensors, readTensors(t, filepath.Join(mnt, "big")), "tensors written with O_DIRECT, read back")
	path := filepath.Join(mnt, "big", "model.safetensors")
	view, err := os.ReadFile(path)
	require.NoError(t, err)
	fd, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0)
	require.NoError(t, err)
	defer fd.Close()
	got := alignedBuf(4 << 20)
	armed.Store(true)
	n, err = fd.ReadAt(got, 4096)
	armed.Store(false)
	require.NoError(t, err)
	require.Equal(t, len(got), n)
	require.True(t, bytes.Equal(view[4096:4096+len(got)], got), "O_DIRECT read of [4096, +4 MiB)")
	require.GreaterOrEqual(t, reads.Load(), int32(4), "a 4 MiB read in 1 MiB requests")
	require.True(t, together.Load(), "the second request of one O_DIRECT read came only after the first was answered")
}
