package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/internal/testenv"
	"github.com/ckptfs/ckptfs/layout/source/s3/s3test"
	"github.com/ckptfs/ckptfs/vfs"
)

var sample = filepath.Join("..", "..", "testdata", "sample")

// logBuffer collects the log of a mount running in another goroutine.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func isMounted(t *testing.T, mnt string) bool {
	b, err := os.ReadFile("/proc/self/mounts")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[1] == mnt {
			return true
		}
	}
	return false
}

// notifyListener is a fake service manager: the socket of NOTIFY_SOCKET.
func notifyListener(t *testing.T, addr string) *net.UnixConn {
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", addr)
	return conn
}

func receive(t *testing.T, conn *net.UnixConn, timeout time.Duration) string {
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(timeout)))
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	require.NoError(t, err)
	return string(buf[:n])
}

func TestSDNotify(t *testing.T) {
	t.Run("unset", func(t *testing.T) {
		t.Setenv("NOTIFY_SOCKET", "")
		require.NoError(t, sdNotify("READY=1"))
	})
	t.Run("path", func(t *testing.T) {
		conn := notifyListener(t, filepath.Join(t.TempDir(), "notify"))
		require.NoError(t, sdNotify("READY=1"))
		require.Equal(t, "READY=1", receive(t, conn, 5*time.Second))
	})
	t.Run("abstract", func(t *testing.T) {
		conn := notifyListener(t, fmt.Sprintf("@ckptfs-test-%d", os.Getpid()))
		require.NoError(t, sdNotify("STOPPING=1"))
		require.Equal(t, "STOPPING=1", receive(t, conn, 5*time.Second))
	})
	t.Run("nobody listening", func(t *testing.T) {
		t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "gone"))
		require.ErrorContains(t, sdNotify("READY=1"), "sd_notify")
	})
}

// TestNotifyReadyWhenMountAnswers: a Type=notify unit is told READY=1 only
// once the mount serves requests, and STOPPING=1 when it is unmounted.
func TestNotifyReadyWhenMountAnswers(t *testing.T) {
	conn := notifyListener(t, filepath.Join(t.TempDir(), "notify"))
	mnt := t.TempDir()
	var stderr logBuffer
	done := make(chan int, 1)
	go func() { done <- run([]string{"mount", "--cache-size", "16MiB", sample, mnt}, io.Discard, &stderr) }()
	t.Cleanup(func() { lazyUnmount(mnt) })

	require.Equal(t, "READY=1", receive(t, conn, 30*time.Second), stderr.String())
	require.True(t, isMounted(t, mnt), "READY=1 before the mount exists")
	stats, err := os.ReadFile(filepath.Join(mnt, ".ckptfs")) // served by the mount
	require.NoError(t, err)
	require.True(t, json.Valid(stats))

	code, _, errs := runCLI("umount", mnt)
	require.Equal(t, 0, code, errs)
	require.Equal(t, "STOPPING=1", receive(t, conn, 30*time.Second))
	select {
	case code := <-done:
		require.Equal(t, 0, code, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("mount did not return after umount")
	}
	require.Contains(t, stderr.String(), "msg=mounting")
	require.False(t, isMounted(t, mnt))
}

// TestHelperFormDaemonizes: "ckptfs SRC MNT -o ..." (what mount(8) runs)
// returns once the mount answers, leaving it served by a detached process.
func TestHelperFormDaemonizes(t *testing.T) {
	mnt := t.TempDir()
	logFile := filepath.Join(t.TempDir(), "ckptfs.log")
	t.Cleanup(func() { lazyUnmount(mnt) })
	code, out, errs := runCLI(sample, mnt, "-o", "ro,dev,suid,cache_size=16MiB,log_format=json,log_file="+logFile+",metrics_addr=127.0.0.1:0")
	require.Equal(t, 0, code, errs)
	require.Empty(t, out+errs)
	// No waiting: the mount answers as soon as the helper returns.
	require.True(t, isMounted(t, mnt))
	entries, err := os.ReadDir(filepath.Join(mnt, "ckpt"))
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	require.ErrorContains(t, os.Mkdir(filepath.Join(mnt, "new"), 0o755), "read-only file system")

	log, err := os.ReadFile(logFile)
	require.NoError(t, err)
	require.Contains(t, string(log), `"msg":"mounting"`, "the daemon logs JSON to --log-file")

	code, _, errs = runCLI("umount", mnt)
	require.Equal(t, 0, code, errs)
}

// TestHelperFormReportsTheDaemonsError: a daemonised mount that fails makes
// the helper fail with its one-line error.
func TestHelperFormReportsTheDaemonsError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-mountpoint")
	code, _, errs := runCLI(sample, missing, "-o", "cache_size=16MiB")
	require.Equal(t, 1, code)
	require.Equal(t, "ckptfs mount: stat "+missing+": no such file or directory\n", errs)
}

func TestMetricsEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	mnt, unmount := mountSample(t, "--metrics-addr", addr, "--block-size", "64KiB", "--prefetch", "0", "--direct-reads=false")
	data, err := os.ReadFile(filepath.Join(mnt, "ckpt", "model.safetensors"))
	require.NoError(t, err)
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	blocks := (len(data) + 64<<10 - 1) / (64 << 10)
	require.Contains(t, string(body), fmt.Sprintf("ckptfs_bytes_served_total %d\n", len(data)))
	require.Contains(t, string(body), fmt.Sprintf("ckptfs_cache_fills_total %d\n", blocks))
	require.Contains(t, string(body), fmt.Sprintf("ckptfs_cache_fill_duration_seconds_count %d\n", blocks))

	// Per-op FUSE histograms and errors, and which binary serves.
	_, err = os.ReadDir(filepath.Join(mnt, "ckpt"))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(mnt, "ckpt", "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
	v, commit := buildInfo()
	require.Eventually(t, func() bool {
		body := scrapeMetrics(t, addr)
		for _, op := range []string{"lookup", "getattr", "open", "read", "release", "opendir", "readdirplus"} {
			if !regexp.MustCompile(`ckptfs_fuse_op_duration_seconds_count\{op="` + op + `"\} [1-9]`).MatchString(body) {
				t.Logf("no %s requests yet", op)
				return false
			}
		}
		return strings.Contains(body, `ckptfs_fuse_op_errors_total{errno="ENOENT",op="lookup"} `) &&
			strings.Contains(body, fmt.Sprintf(`ckptfs_build_info{commit=%q,goversion=%q,version=%q} 1`, commit, runtime.Version(), v))
	}, 5*time.Second, 50*time.Millisecond)
	unmount()
}

func scrapeMetrics(t *testing.T, addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// TestMetricsStoreRequests: an s3:// mount exports the latency of the
// store's requests by operation.
func TestMetricsStoreRequests(t *testing.T) {
	g := s3test.StartGateway(t, s3test.GatewayOptions{})
	g.Bucket(t, "metrics")
	g.Upload(t, "metrics", "run/ckpt", filepath.Join(sample, "ckpt"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	mnt := t.TempDir()
	done := make(chan int, 1)
	stderr := &logBuffer{}
	go func() {
		done <- run([]string{"mount", "--metrics-addr", addr, "--cache-size", "64MiB", "s3://metrics/run", mnt}, io.Discard, stderr)
	}()
	t.Cleanup(func() { lazyUnmount(mnt) })
	view := filepath.Join(mnt, "ckpt", "model.safetensors")
	require.Eventually(t, func() bool { _, err := os.Stat(view); return err == nil }, 30*time.Second, 10*time.Millisecond, stderr.String())
	_, err = os.ReadFile(view)
	require.NoError(t, err)
	body := scrapeMetrics(t, addr)
	for _, op := range []string{"ListObjectsV2", "GetObject"} {
		require.Regexp(t, `ckptfs_source_request_duration_seconds_count\{op="`+op+`"\} [1-9]`, body)
	}
	code, _, errs := runCLI("umount", mnt)
	require.Equal(t, 0, code, errs)
	require.Equal(t, 0, <-done, stderr.String())
}

// TestMountReadsLocalSourcesDirectly: by default the view files of a local
// source are read straight from the shards, past the block cache.
func TestMountReadsLocalSourcesDirectly(t *testing.T) {
	mnt, unmount := mountSample(t)
	data, err := os.ReadFile(filepath.Join(mnt, "ckpt", "model.safetensors"))
	require.NoError(t, err)
	raw, err := os.ReadFile(filepath.Join(mnt, ".ckptfs"))
	require.NoError(t, err)
	var st struct {
		BytesServed int64 `json:"bytes_served"`
		Cache       struct {
			Fills int64 `json:"fills"`
		} `json:"cache"`
	}
	require.NoError(t, json.Unmarshal(raw, &st))
	require.Equal(t, int64(len(data)), st.BytesServed)
	require.Zero(t, st.Cache.Fills)
	unmount()
}

// mountSample runs ckptfs mount FLAGS on the sample checkpoint in the
// background until its view answers; unmount runs ckptfs umount and checks
// that the mount then exits 0.
func mountSample(t *testing.T, flags ...string) (mnt string, unmount func()) {
	t.Helper()
	return mountSampleAt(t, t.TempDir(), flags...)
}

// mountSampleAt is mountSample at the given mount point. The mount runs
// in a process of its own, as a real one does (TestMain runs this binary
// as ckptfs when it is called so): mounts made one after another in one
// process share its file descriptor numbers, and a mount whose server
// outlives its test could act on the next one's /dev/fuse.
func mountSampleAt(t *testing.T, mnt string, flags ...string) (string, func()) {
	t.Helper()
	p := startMount(t, append(append([]string{"mount"}, flags...), sample, mnt)...)
	t.Cleanup(func() { lazyUnmount(mnt) })
	view := filepath.Join(mnt, "ckpt", "model.safetensors")
	require.Eventually(t, func() bool { _, err := os.Stat(view); return err == nil }, 30*time.Second, 10*time.Millisecond, p.stderr.String())
	mountPids[mnt] = p.cmd.Process.Pid
	return mnt, func() {
		t.Helper()
		code, _, errs := runCLI("umount", mnt)
		require.Equal(t, 0, code, errs)
		require.NoError(t, p.cmd.Wait(), p.stderr.String())
	}
}

// mountPids are the processes serving the mounts mountSampleAt made, by
// mount point.
var mountPids = map[string]int{}

// mountProcess is this test binary running as ckptfs.
type mountProcess struct {
	cmd    *exec.Cmd
	stderr *logBuffer
}

// startMount starts this binary as `ckptfs ARGS...`, killed at the end of
// the test if it still runs.
func startMount(t *testing.T, args ...string) *mountProcess {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	p := &mountProcess{cmd: &exec.Cmd{Path: exe, Args: append([]string{"ckptfs"}, args...)}, stderr: &logBuffer{}}
	p.cmd.Stderr = p.stderr
	// A killed mount whose own thread waits in the kernel on its mount (a
	// close of go-fuse's poll probe, answered by no one once killed) keeps
	// the stderr pipe open: Wait gives up on the pipe after WaitDelay
	// instead of waiting for ever.
	p.cmd.WaitDelay = 10 * time.Second
	require.NoError(t, p.cmd.Start())
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	})
	return p
}

// TestMountReadAheadFollowsTheSourceDisk: a mount reads ahead as far as the
// disk that holds its source does (8 MiB where the source is on no disk),
// unless --read-ahead or -o read_ahead says otherwise.
func TestMountReadAheadFollowsTheSourceDisk(t *testing.T) {
	testenv.RequireSystem(t, os.Geteuid() == 0, "root (read_ahead_kb is root's)")
	want := int64(vfs.DefaultReadAhead)
	if ra, ok := vfs.SourceReadAhead(sample); ok {
		want = ra
	}
	for _, tc := range []struct {
		flags []string
		kb    int64
	}{
		{nil, want >> 10},
		{[]string{"--read-ahead", "2MiB"}, 2048},
		{[]string{"-o", "read_ahead=3MiB"}, 3072},
	} {
		mnt, unmount := mountSample(t, tc.flags...)
		var st unix.Stat_t
		require.NoError(t, unix.Stat(mnt, &st))
		knob := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
		// Written once the kernel has answered INIT (which would lower it),
		// so shortly after the mount starts answering: mountSample waits for
		// a view, not for the mount's readiness.
		want, got := strconv.FormatInt(tc.kb, 10), ""
		for deadline := time.Now().Add(5 * time.Second); got != want && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			b, err := os.ReadFile(knob)
			require.NoError(t, err)
			got = strings.TrimSpace(string(b))
		}
		assert.Equal(t, want, got, "%v", tc.flags)
		unmount()
	}
}
