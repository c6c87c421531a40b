// Package objstoretest runs the real servers the object store tests start
// on 127.0.0.1 (versitygw, fake-gcs-server, Azurite): finding the tool,
// starting it on a free port, waiting for it to answer, stopping,
// freezing and killing it, a reverse proxy in front of any of them that records what a client
// sends and injects faults (proxy.go), and the checks every store's tests
// make (suite.go, traffic.go).
package objstoretest

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

// Process is a server started by Serve.
type Process struct{ cmd *exec.Cmd }

// Serve starts cmd, a server of what (for messages), killed at the end of
// the test (and with the test process), and waits until url gets an HTTP
// answer (any status: a 403 to an anonymous request is a server up). Its
// output is logged when the test failed.
func Serve(t testing.TB, what string, cmd *exec.Cmd, url string) *Process {
	t.Helper()
	log := new(bytes.Buffer)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("%s log:\n%s", what, tail(log.Bytes(), 4000))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return &Process{cmd}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s at %s did not answer: %v", what, url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	p.cmd.Process.Kill()
	p.cmd.Wait()
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
