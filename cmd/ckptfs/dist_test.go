package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
)

// TestDistPackagesInstallAndMount: make dist, for this machine's
// architecture, gives a tarball, a .deb and a wheel; the .deb unpacked into
// a scratch root (dpkg -x) and the wheel installed into a fresh venv (pip
// install --no-index) each give a static ckptfs that says its version and
// mounts the embedded sample (issue 34.8: make install from a clone with Go
// was the only way to install).
func TestDistPackagesInstallAndMount(t *testing.T) {
	var missing []string
	for _, tool := range []string{"make", "git", "dpkg-deb", "dpkg", "python3", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	testenv.RequireSystem(t, len(missing) == 0, "make, git, dpkg-deb, dpkg, python3 and tar (missing: "+strings.Join(missing, ", ")+")")
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	describe, err := exec.Command("git", "-C", root, "describe", "--tags", "--always", "--dirty").Output()
	testenv.RequireSystem(t, err == nil, "git with the work tree")
	version := "ckptfs " + strings.TrimSpace(string(describe)) + "\n"

	dist := t.TempDir()
	cmd := exec.Command("make", "-C", root, "dist", "DIST="+dist, "DIST_ARCHES="+runtime.GOARCH)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	find := func(pattern string) string {
		m, err := filepath.Glob(filepath.Join(dist, pattern))
		require.NoError(t, err)
		require.Len(t, m, 1, pattern)
		return m[0]
	}
	find("ckptfs-*-linux-" + runtime.GOARCH + ".tar.gz")
	deb := find("ckptfs_*_" + runtime.GOARCH + ".deb")
	wheelArch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[runtime.GOARCH]
	wheel := find("ckptfs-*-py3-none-manylinux_2_17_" + wheelArch + ".*.whl")

	scratch := t.TempDir()
	out, err = exec.Command("dpkg", "-x", deb, scratch).CombinedOutput()
	require.NoError(t, err, "%s", out)
	out, err = exec.Command("dpkg-deb", "-f", deb, "Package", "Architecture", "Depends").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "Package: ckptfs\nArchitecture: "+runtime.GOARCH+"\nDepends: fuse3\n", string(out))
	for _, f := range []string{"ckptfs.service", "mnt-ckpts.mount"} {
		_, err := os.Stat(filepath.Join(scratch, "usr", "share", "doc", "ckptfs", "examples", f))
		require.NoError(t, err)
	}

	venv := filepath.Join(t.TempDir(), "venv")
	out, err = exec.Command("python3", "-m", "venv", venv).CombinedOutput()
	testenv.RequireSystem(t, err == nil, "python3 -m venv ("+string(out)+")")
	out, err = exec.Command(filepath.Join(venv, "bin", "pip"), "install", "-q", "--no-index", "--disable-pip-version-check", wheel).CombinedOutput()
	require.NoError(t, err, "%s", out)

	for what, bin := range map[string]string{
		".deb":  filepath.Join(scratch, "usr", "bin", "ckptfs"),
		"wheel": filepath.Join(venv, "bin", "ckptfs"),
	} {
		got, err := exec.Command(bin, "--version").Output()
		require.NoError(t, err, what)
		require.True(t, strings.HasPrefix(string(got), version), "%s: %q", what, got)
		file, err := os.ReadFile(bin)
		require.NoError(t, err)
		require.False(t, bytes.Contains(file, []byte("ld-linux")), "%s: not a static binary", what)
		demoMount(t, bin)
	}
}

// demoMount mounts the embedded sample with bin, as make demo does, and
// checks that its view file is the bytes bin's export writes.
func demoMount(t *testing.T, bin string) {
	t.Helper()
	exported := filepath.Join(t.TempDir(), "export")
	out, err := exec.Command(bin, "export", "--quiet", filepath.Join(sample, "ckpt"), exported).CombinedOutput()
	require.NoError(t, err, "%s", out)
	want, err := os.ReadFile(filepath.Join(exported, "model.safetensors"))
	require.NoError(t, err)

	mnt := t.TempDir()
	var stderr logBuffer
	cmd := exec.Command(bin, "mount", sample, mnt)
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		lazyUnmount(mnt)
	})
	view := filepath.Join(mnt, "ckpt", "model.safetensors")
	require.Eventually(t, func() bool { _, err := os.Stat(view); return err == nil }, 30*time.Second, 10*time.Millisecond, stderr.String())
	got, err := os.ReadFile(view)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "%s: the view differs from the export", bin)
	out, err = exec.Command(bin, "umount", mnt).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NoError(t, cmd.Wait(), stderr.String())
}
