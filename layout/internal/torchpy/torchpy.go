// Package torchpy finds the Python that tests run real torch (or moto) in:
// $CKPTFS_PYTHON, else the e2e virtual environment. Without one a test is
// skipped, unless CKPTFS_REQUIRE_PYTHON=1 (make test-go sets it), which
// makes it fail.
package torchpy

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
		_, file, _, _ := runtime.Caller(0) // layout/internal/torchpy/torchpy.go
		py = filepath.Join(filepath.Dir(file), "..", "..", "..", "e2e", ".venv", "bin", "python")
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
