// Package testenv is what tests need of the machine, in one place: the
// Python that runs real torch, safetensors or moto ($CKPTFS_PYTHON, else
// the e2e virtual environment), and root, util-linux and fuse3. A test
// whose need is missing is skipped, except where make test runs it:
// CKPTFS_REQUIRE_PYTHON=1 and CKPTFS_REQUIRE_SYSTEM=1 (make test-go sets
// both) make it fail, so a skip never passes for a check on CI.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Python returns the Python to run, one that can import module (e.g.
// "torch.distributed.checkpoint"), or skips (fails) t.
func Python(t testing.TB, module string) string {
	t.Helper()
	must := os.Getenv("CKPTFS_REQUIRE_PYTHON") == "1"
	py := os.Getenv("CKPTFS_PYTHON")
	if py == "" {
		_, file, _, _ := runtime.Caller(0) // internal/testenv/testenv.go
		py = filepath.Join(filepath.Dir(file), "..", "..", "e2e", ".venv", "bin", "python")
	}
	err := exec.Command(py, "-c", "import "+module).Run()
	switch {
	case err == nil:
		return py
	case must:
		t.Fatalf("CKPTFS_REQUIRE_PYTHON=1 but %s cannot import %s (make venv, or set CKPTFS_PYTHON): %v", py, module, err)
	default:
		t.Skipf("no Python with %s at %s (make venv, or set CKPTFS_PYTHON; CKPTFS_REQUIRE_PYTHON=1 turns this skip into a failure): %v", module, py, err)
	}
	return ""
}

// RequireSystem fails t when what (root, util-linux, fuse3) is missing
// (ok false) where make test runs it (CKPTFS_REQUIRE_SYSTEM=1, as root on
// a machine with util-linux and fuse3), and skips it elsewhere.
func RequireSystem(t testing.TB, ok bool, what string) {
	t.Helper()
	switch {
	case ok:
	case os.Getenv("CKPTFS_REQUIRE_SYSTEM") == "1":
		t.Fatalf("CKPTFS_REQUIRE_SYSTEM=1 but %s is missing", what)
	default:
		t.Skipf("%s is needed (CKPTFS_REQUIRE_SYSTEM=1 turns this skip into a failure)", what)
	}
}

// LiveHeap is the heap in use after a full collection, run twice so that
// the sync.Pools' victims are gone too: what a test that bounds memory
// compares before and after.
func LiveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
