// Package objstoretest runs the real servers the object store tests start
// on 127.0.0.1 (versitygw, fake-gcs-server, Azurite): finding the tool,
// starting it on a free port, waiting for it to answer, stopping,
// freezing and killing it, one server that a package's tests share
// (shared.go), a reverse proxy in front of any of them that records what a
// client sends and injects faults (proxy.go), and the checks every store's
// tests make (suite.go, traffic.go, emulator.go).
package objstoretest

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"

	"github.com/ckptfs/ckptfs/internal/testenv"
)

// Tool finds a server the tests run: $env, else rel under the module's
// .tools (make tools installs it there). A test without it is skipped,
// unless $env is set (make test sets it) or CKPTFS_REQUIRE_SYSTEM=1, which
// make it fail.
func Tool(t testing.TB, env, rel string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v (make tools installs it)", env, err)
		}
		return p
	}
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, ".tools", rel)
			_, err := os.Stat(p)
			testenv.RequireSystem(t, err == nil, p+" (make tools installs it; or set "+env+")")
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("%s: no go.mod above the test's directory", rel)
		}
		dir = parent
	}
}

// FreePort is a TCP port of 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Process is a server started by Serve or Launch.
type Process struct {
	what string
	cmd  *exec.Cmd
	log  *syncBuffer
}

// Serve starts cmd, a server of what (for messages), killed at the end of
// the test (and with the test process), and waits until url gets an HTTP
// answer (any status: a 403 to an anonymous request is a server up). Its
// output is logged when the test failed.
func Serve(t testing.TB, what string, cmd *exec.Cmd, url string) *Process {
	t.Helper()
	p := Launch(t, what, cmd, url)
	t.Cleanup(func() {
		p.stop()
		p.logIfFailed(t)
	})
	return p
}

// Launch starts cmd as Serve does, failing t if it does not answer, but
// tied to no test: it runs until Kill, Main's end or the end of the test
// process (a shared server, Servers.Shared).
func Launch(t testing.TB, what string, cmd *exec.Cmd, url string) *Process {
	t.Helper()
	p := &Process{what: what, cmd: cmd, log: new(syncBuffer)}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return p
		}
		if time.Now().After(deadline) {
			p.stop()
			t.Fatalf("%s at %s did not answer: %v; its log:\n%s", what, url, err, tail(p.log.Bytes(), 4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *Process) stop() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

// logIfFailed logs the server's output (its last 4000 bytes) to t if t
// failed.
func (p *Process) logIfFailed(t testing.TB) {
	if t.Failed() {
		t.Logf("%s log:\n%s", p.what, tail(p.log.Bytes(), 4000))
	}
}

// syncBuffer is a server's output, read while the server writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // GUARDED_BY(mu)
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// Signal sends sig to the server (SIGSTOP stops it answering, SIGCONT
// resumes it).
func (p *Process) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if sig != syscall.SIGSTOP {
		return
	}
	// A stop takes each thread as it next leaves the kernel: wait until the
	// whole process is stopped, or a request sent now may still be served.
	deadline := time.Now().Add(10 * time.Second)
	for {
		proc, err := procfs.NewProc(p.cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := proc.Stat(); err == nil && st.State == "T" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the server did not stop")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Kill stops the server for good (connections are then refused).
func (p *Process) Kill(t testing.TB) {
	t.Helper()
	p.stop()
}

// UploadDir puts every regular file under the local directory dir with put,
// keyed prefix/REL (REL slash-separated), and fails t on the first error.
func UploadDir(t testing.TB, prefix, dir string, put func(key string, data []byte) error) {
	t.Helper()
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return put(prefix+"/"+filepath.ToSlash(rel), data)
	})
	if err != nil {
		t.Fatal(err)
	}
}
