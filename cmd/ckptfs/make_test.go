package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
)

// TestMakeBuildStampsVersion: make build stamps the version (git describe)
// and the commit from git, also where Go cannot read them itself
// (GOFLAGS=-buildvcs=false) (issue 34.7: make install printed devel and
// commit unknown).
func TestMakeBuildStampsVersion(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	_, makeErr := exec.LookPath("make")
	describe, gitErr := exec.Command("git", "-C", root, "describe", "--tags", "--always", "--dirty").Output()
	testenv.RequireSystem(t, makeErr == nil && gitErr == nil, "make, and git with the work tree")
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	require.NoError(t, err)

	bin := filepath.Join(t.TempDir(), "ckptfs")
	cmd := exec.Command("make", "-C", root, "build", "BIN="+bin)
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	got, err := exec.Command(bin, "--version").Output()
	require.NoError(t, err)
	lines := strings.Split(string(got), "\n")
	require.Equal(t, "ckptfs "+strings.TrimSpace(string(describe)), lines[0])
	require.True(t, strings.HasPrefix(lines[1], "commit "+strings.TrimSpace(string(head))), lines[1])
}

// TestMakeDemoUsesAFolderOfItsOwn: make demo works in a fresh temporary
// folder, so that two demos at once do not clobber each other (issue 34.7:
// it always used /tmp/ckptfs-demo). The demo itself runs in make demo and
// CI; here make prints what it would run.
func TestMakeDemoUsesAFolderOfItsOwn(t *testing.T) {
	_, err := exec.LookPath("make")
	testenv.RequireSystem(t, err == nil, "make")
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	// -W: as if the demo's venv were made already; -n: print, run nothing.
	out, err := exec.Command("make", "-C", root, "-n", "-W", "e2e/requirements-demo.txt", "demo").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NotContains(t, string(out), "/tmp/ckptfs-demo ")
	require.Contains(t, string(out), `mktemp -d "${TMPDIR:-/tmp}/ckptfs-demo.XXXXXX"`)
}
