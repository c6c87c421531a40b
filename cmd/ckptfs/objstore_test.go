package main

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
	"github.com/ckptfs/ckptfs/layout/source/azure/azuretest"
	"github.com/ckptfs/ckptfs/layout/source/gcs/gcstest"
)

// TestObjectStoreViews: a DCP checkpoint saved by torch (4 ranks, FSDP2)
// uploaded to fake-gcs-server and to Azurite mounts as gs:// and az://
// with a view byte-exact against the mount of the local directory (with
// and without --fetch-ahead); a
// missing name is ENOENT through the mount; mountinfo names the URL;
// inspect and export take the URL too.
func TestObjectStoreViews(t *testing.T) {
	testenv.RequireSystem(t, os.Geteuid() == 0, "root (FUSE mounts)")
	const fixture = "fsdp2_4ranks"
	local := filepath.Join("..", "..", "testdata", fixture)
	localMnt := mountAt(t, local)
	for _, tc := range []struct {
		scheme string
		upload func(t *testing.T)
	}{
		{"gs", func(t *testing.T) {
			s := gcstest.Start(t)
			s.Bucket(t, "ckpts")
			s.Upload(t, "ckpts", "run/ckpt", filepath.Join(local, "ckpt"))
		}},
		{"az", func(t *testing.T) {
			s := azuretest.Start(t)
			s.Container(t, "ckpts")
			s.Upload(t, "ckpts", "run/ckpt", filepath.Join(local, "ckpt"))
		}},
	} {
		t.Run(tc.scheme, func(t *testing.T) {
			tc.upload(t)
			url := tc.scheme + "://ckpts/run"
			// Objects read in order are streamed (the default,
			// readpath.For): requests of 64 MiB in a 512 MiB cache; the
			// other mount makes a request per block and extent
			// (--fetch-ahead=false).
			big := mountAt(t, url, "--cache-size", "512MiB")
			mnt := mountAt(t, url, "--cache-dir", t.TempDir(), "--fetch-ahead=false")
			mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(mnt))
			require.NoError(t, err)
			require.Len(t, mounts, 1)
			assert.Equal(t, url, mounts[0].Source, "mountinfo names the source as given")
			files := 0
			err = filepath.WalkDir(filepath.Join(localMnt, "ckpt"), func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				rel, _ := filepath.Rel(localMnt, p)
				want, err := os.ReadFile(p)
				require.NoError(t, err)
				for _, m := range []string{mnt, big} {
					got, err := os.ReadFile(filepath.Join(m, rel))
					require.NoError(t, err, rel)
					require.Equal(t, len(want), len(got), rel)
					require.True(t, string(want) == string(got), "%s: the %s view differs from the local one", rel, tc.scheme)
				}
				files++
				return nil
			})
			require.NoError(t, err)
			require.GreaterOrEqual(t, files, 2, "the view has config.json and the weights")
			_, err = os.Stat(filepath.Join(mnt, "ckpt", "no-such-file"))
			require.True(t, errors.Is(err, syscall.ENOENT), "%v", err)
			_, err = os.Stat(filepath.Join(mnt, "no-such-dir"))
			require.True(t, errors.Is(err, syscall.ENOENT), "%v", err)

			code, out, errs := runCLI("inspect", url+"/ckpt")
			require.Equal(t, 0, code, errs)
			assert.Contains(t, out, "dcp")
			exported := filepath.Join(t.TempDir(), "out")
			code, _, errs = runCLI("export", "--quiet", url+"/ckpt", exported)
			require.Equal(t, 0, code, errs)
			want, err := os.ReadFile(filepath.Join(localMnt, "ckpt", "model.safetensors"))
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(exported, "model.safetensors"))
			require.NoError(t, err)
			require.True(t, string(want) == string(got), "export of %s differs from the local view", url)
		})
	}
}

// mountAt mounts src with flags in the background until its view of ckpt
// answers, unmounted at the end of the test.
func mountAt(t *testing.T, src string, flags ...string) string {
	t.Helper()
	mnt := t.TempDir()
	done := make(chan int, 1)
	stderr := &logBuffer{}
	args := append(append([]string{"mount", "--cache-size", "64MiB"}, flags...), src, mnt)
	go func() { done <- run(args, io.Discard, stderr) }()
	t.Cleanup(func() {
		code, _, errs := runCLI("umount", mnt)
		if code != 0 {
			lazyUnmount(mnt)
			t.Errorf("umount %s: %s", mnt, errs)
		}
		select {
		case code := <-done:
			assert.Equal(t, 0, code, stderr.String())
		case <-time.After(30 * time.Second):
			t.Errorf("the mount of %s did not exit", src)
		}
	})
	view := filepath.Join(mnt, "ckpt", "model.safetensors")
	require.Eventually(t, func() bool { _, err := os.Stat(view); return err == nil }, 30*time.Second, 10*time.Millisecond, stderr.String())
	return mnt
}
