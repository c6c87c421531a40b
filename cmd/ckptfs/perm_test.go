package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
	"github.com/ckptfs/ckptfs/layout/source/s3/s3test"
)

// Users the permission tests act as: other users of a shared host. They
// need no passwd entry: the client runs with their credentials.
var (
	nobody = user{65534, 65534}
	alice  = user{4242, 4242}
	root   = user{0, 0}
)

type user struct{ uid, gid uint32 }

func (u user) String() string { return fmt.Sprintf("uid %d", u.uid) }

// as runs argv as u, with no supplementary groups: its stdout, and its
// stderr as the error when it fails.
func as(u user, argv ...string) ([]byte, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: []uint32{}}}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s as %s: %v: %s", strings.Join(argv, " "), u, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// openTempDir is a test directory every user may search: t.TempDir's are
// 0700, which would keep them out of everything below.
func openTempDir(t *testing.T) string {
	dir := t.TempDir()
	for d := dir; d != filepath.Clean(os.TempDir()) && d != filepath.Dir(d); d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	return dir
}

// copyCkpt copies the sample checkpoint to dir with the directory mode
// dirMode, each file owned by owner(name) with mode mode(name).
func copyCkpt(t *testing.T, dir string, dirMode os.FileMode, owner func(string) user, mode func(string) os.FileMode) {
	require.NoError(t, os.Mkdir(dir, dirMode))
	require.NoError(t, os.Chmod(dir, dirMode))
	ents, err := os.ReadDir(filepath.Join(sample, "ckpt"))
	require.NoError(t, err)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(sample, "ckpt", e.Name()))
		require.NoError(t, err)
		p := filepath.Join(dir, e.Name())
		require.NoError(t, os.WriteFile(p, b, 0o600))
		require.NoError(t, os.Chmod(p, mode(e.Name())))
		u := owner(e.Name())
		require.NoError(t, os.Chown(p, int(u.uid), int(u.gid)))
	}
}

func all[T any](v T) func(string) T { return func(string) T { return v } }

// mountAs starts `ckptfs mount --allow-other FLAGS SRC MNT` as root and
// waits until the mount answers.
func mountAllowOther(t *testing.T, src string, flags ...string) string {
	t.Helper()
	mnt := filepath.Join(openTempDir(t), "mnt")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	args := append(append([]string{"mount", "--allow-other"}, flags...), src, mnt)
	p := startMount(t, args...)
	t.Cleanup(func() { lazyUnmount(mnt) })
	require.Eventually(t, func() bool { return isMounted(t, mnt) }, 30*time.Second, 10*time.Millisecond, p.stderr.String())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("mount log:\n%s", p.stderr.String())
		}
	})
	return mnt
}

const hubCommit = "0123456789abcdef0123456789abcdef01234567"

// hubRepo lays testdata/plain_hf/ckpt out as an HF hub cache repo under
// hub: blobs/ (mode blobsMode), snapshots/COMMIT/ linking into it, refs/main.
func hubRepo(t *testing.T, hub, repo string, blobsMode os.FileMode) {
	dir := filepath.Join(hub, repo)
	blobs, snap := filepath.Join(dir, "blobs"), filepath.Join(dir, "snapshots", hubCommit)
	for _, d := range []string{blobs, snap, filepath.Join(dir, "refs")} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	src := filepath.Join("..", "..", "testdata", "plain_hf", "ckpt")
	ents, err := os.ReadDir(src)
	require.NoError(t, err)
	for i, e := range ents {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		blob := fmt.Sprintf("%040x", i+1)
		require.NoError(t, os.WriteFile(filepath.Join(blobs, blob), data, 0o644))
		require.NoError(t, os.Symlink("../../blobs/"+blob, filepath.Join(snap, e.Name())))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "refs", "main"), []byte(hubCommit), 0o644))
	require.NoError(t, os.Chmod(blobs, blobsMode))
}

// permCase is one access through a mount, as one user.
type permCase struct {
	name string
	as   user
	argv []string // run as as, with {mnt} replaced by the mount point
	// want: "" succeeds; else a part of the error (Permission denied)
	want string
	// same: the output equals root's for the same command
	same bool
}

func runCases(t *testing.T, mnt string, cases []permCase) {
	t.Helper()
	for _, c := range cases {
		argv := make([]string, len(c.argv))
		for i, a := range c.argv {
			argv[i] = strings.ReplaceAll(a, "{mnt}", mnt)
		}
		out, err := as(c.as, argv...)
		if c.want != "" {
			require.ErrorContains(t, err, c.want, c.name)
			continue
		}
		require.NoError(t, err, c.name)
		if c.same {
			ref, err := as(root, argv...)
			require.NoError(t, err, c.name)
			require.NotEmpty(t, ref, c.name)
			require.True(t, bytes.Equal(ref, out), "%s: %s reads other bytes than root", c.name, c.as)
		}
	}
}

const denied = "Permission denied"

// TestMountNeverGivesMoreThanTheSource: mounted by root with --allow-other
// over a local source, every name shows its source's owner and mode
// without write bits, a view file the intersection of its shards', and the
// kernel holds other users to them (default_permissions): what a user
// cannot read in the source, they cannot read through the mount; what they
// can, they read byte for byte.
func TestMountNeverGivesMoreThanTheSource(t *testing.T) {
	testenv.RequireSystem(t, os.Geteuid() == 0, "root (acting as other users)")
	src := filepath.Join(openTempDir(t), "src")
	require.NoError(t, os.Mkdir(src, 0o755))
	byRoot := all(root)
	copyCkpt(t, filepath.Join(src, "public"), 0o755, byRoot, all(os.FileMode(0o644)))
	// The operator may open .ckptfs to all.
	statsMnt := mountAllowOther(t, filepath.Join(src, "public"), "-o", "stats_mode=0444")
	_, err := as(nobody, "cat", filepath.Join(statsMnt, ".ckptfs"))
	require.NoError(t, err)
	copyCkpt(t, filepath.Join(src, "secret"), 0o700, byRoot, all(os.FileMode(0o600)))
	// Shards of two owners: readable by whom both are readable by.
	copyCkpt(t, filepath.Join(src, "mixed"), 0o755, func(name string) user {
		if name == "__1_0.distcp" {
			return alice
		}
		return root
	}, func(name string) os.FileMode {
		if name == "__1_0.distcp" {
			return 0o640
		}
		return 0o644
	})
	copyCkpt(t, filepath.Join(src, "mixed-open"), 0o755, func(name string) user {
		if name == "__1_0.distcp" {
			return alice
		}
		return root
	}, all(os.FileMode(0o644)))
	copyCkpt(t, filepath.Join(src, "alices"), 0o755, all(alice), all(os.FileMode(0o600)))
	// Readable shards, unreadable .metadata: the view's header, index and
	// layout are made of it.
	copyCkpt(t, filepath.Join(src, "metadata"), 0o755, byRoot, func(name string) os.FileMode {
		if name == ".metadata" {
			return 0o600
		}
		return 0o644
	})
	require.NoError(t, os.WriteFile(filepath.Join(src, "plain.txt"), []byte("root's\n"), 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(src, "private"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(src, "private", "notes.txt"), []byte("notes\n"), 0o644))
	require.NoError(t, os.Symlink("public", filepath.Join(src, "latest")))
	// A readable checkpoint in an unreadable directory, and a link to it
	// from a readable one: the link does not open the directory.
	copyCkpt(t, filepath.Join(src, "private", "step"), 0o755, byRoot, all(os.FileMode(0o644)))
	require.NoError(t, os.Symlink("private/step", filepath.Join(src, "latest-private")))

	// Hub cache repos whose snapshots link into blobs/: one readable, one
	// whose blobs/ is 0700.
	hubRepo(t, filepath.Join(src, "hub"), "models--org--open", 0o755)
	hubRepo(t, filepath.Join(src, "hub"), "models--org--closed", 0o700)

	// Megatron tensor-parallel ranks in subdirectories: one of them 0700.
	megatron := filepath.Join("..", "..", "testdata", "megatron_legacy_llama_tp2", "ckpt", "iter_0000010")
	for _, name := range []string{"tp-open", "tp-closed"} {
		require.NoError(t, os.CopyFS(filepath.Join(src, name), os.DirFS(megatron)))
	}
	require.NoError(t, os.Chmod(filepath.Join(src, "tp-closed", "mp_rank_01"), 0o700))

	mnt := mountAllowOther(t, src)
	model := func(dir string) string { return "{mnt}/" + dir + "/model.safetensors" }
	snap := func(repo string) string {
		return "{mnt}/hub/models--org--" + repo + "/snapshots/" + hubCommit + "/model-00001-of-00003.safetensors"
	}
	runCases(t, mnt, []permCase{
		{name: "public view", as: nobody, argv: []string{"cat", model("public")}, same: true},
		{name: "public sidecar", as: nobody, argv: []string{"cat", "{mnt}/public/config.json"}, same: true},
		{name: "latest link", as: nobody, argv: []string{"cat", model("latest")}, same: true},
		{name: "list the root", as: nobody, argv: []string{"ls", "{mnt}"}, same: true},
		{name: "0700 checkpoint listed", as: nobody, argv: []string{"ls", "{mnt}/secret"}, want: denied},
		{name: "0700 checkpoint view", as: nobody, argv: []string{"cat", model("secret")}, want: denied},
		{name: "0700 checkpoint config", as: nobody, argv: []string{"cat", "{mnt}/secret/config.json"}, want: denied},
		{name: "0600 plain file", as: nobody, argv: []string{"cat", "{mnt}/plain.txt"}, want: denied},
		{name: "0600 plain file, root", as: root, argv: []string{"cat", "{mnt}/plain.txt"}},
		{name: "0700 directory listed", as: nobody, argv: []string{"ls", "{mnt}/private"}, want: denied},
		{name: "0700 directory's file", as: nobody, argv: []string{"cat", "{mnt}/private/notes.txt"}, want: denied},
		{name: "link into a 0700 directory", as: nobody, argv: []string{"cat", model("latest-private")}, want: denied},
		{name: "link into a 0700 directory, listed", as: nobody, argv: []string{"ls", "{mnt}/latest-private"}, want: denied},
		{name: "link into a 0700 directory, root", as: root, argv: []string{"cat", model("latest-private")}},
		{name: "mixed owners, other", as: nobody, argv: []string{"cat", model("mixed")}, want: denied},
		{name: "mixed owners, who may read both", as: alice, argv: []string{"cat", model("mixed")}, same: true},
		{name: "mixed owners, readable", as: nobody, argv: []string{"cat", model("mixed-open")}, same: true},
		{name: "another's 0600 shards, their owner", as: alice, argv: []string{"cat", model("alices")}, same: true},
		{name: "another's 0600 shards, other", as: nobody, argv: []string{"cat", model("alices")}, want: denied},
		{name: "hub snapshot", as: nobody, argv: []string{"cat", snap("open")}, same: true},
		{name: "hub snapshot, 0700 blobs", as: nobody, argv: []string{"cat", snap("closed")}, want: denied},
		{name: "hub snapshot, 0700 blobs, root", as: root, argv: []string{"cat", snap("closed")}},
		{name: "ranks in subdirectories", as: nobody, argv: []string{"cat", model("tp-open")}, same: true},
		{name: "a rank's 0700 subdirectory", as: nobody, argv: []string{"cat", model("tp-closed")}, want: denied},
		{name: "a rank's 0700 subdirectory, root", as: root, argv: []string{"cat", model("tp-closed")}},
		{name: "0600 .metadata, readable shards", as: nobody, argv: []string{"cat", model("metadata")}, want: denied},
		{name: "0600 .metadata, the index", as: nobody, argv: []string{"cat", "{mnt}/metadata/model.safetensors.index.json"}, want: denied},
		{name: "0600 .metadata, a sidecar", as: nobody, argv: []string{"cat", "{mnt}/metadata/config.json"}, same: true},
		{name: "stats file", as: nobody, argv: []string{"cat", "{mnt}/.ckptfs"}, want: denied},
		{name: "stats file, mounter", as: root, argv: []string{"cat", "{mnt}/.ckptfs"}},
		{name: "read-only", as: root, argv: []string{"touch", "{mnt}/public/config.json"}, want: "Read-only"},
	})

	// What is shown: the source's owners and modes without write bits.
	for _, c := range []struct {
		name string
		u    user
		perm os.FileMode
	}{
		{"secret", root, 0o500},
		{"secret/model.safetensors", root, 0o400},
		{"secret/config.json", root, 0o400},
		{"public", root, 0o555},
		{"public/model.safetensors", root, 0o444},
		{"plain.txt", root, 0o400},
		{"private", root, 0o500},
		{"alices/model.safetensors", alice, 0o400},
		{"mixed/model.safetensors", alice, 0o440},
		{"mixed-open/model.safetensors", root, 0o444},
		{"latest", root, 0o555},
		{"latest-private", root, 0o500},
		{".ckptfs", root, 0o400},
	} {
		fi, err := os.Stat(filepath.Join(mnt, c.name))
		require.NoError(t, err, c.name)
		st := fi.Sys().(*syscall.Stat_t)
		require.Equal(t, c.perm, fi.Mode().Perm(), c.name)
		require.Equal(t, c.u, user{st.Uid, st.Gid}, c.name)
	}
}

// TestMountWritesAsTheWriter: in a --rw --allow-other mount by root, a user
// creates a checkpoint only where they may write in the source, and it is
// theirs: the directory and the files committed into it.
func TestMountWritesAsTheWriter(t *testing.T) {
	testenv.RequireSystem(t, os.Geteuid() == 0, "root (acting as other users)")
	top := openTempDir(t)
	src := filepath.Join(top, "src")
	require.NoError(t, os.Mkdir(src, 0o755))
	for _, d := range []struct {
		name string
		mode os.FileMode
		u    user
	}{{"shared", 0o777, root}, {"roots", 0o755, root}, {"alices", 0o755, alice}} {
		p := filepath.Join(src, d.name)
		require.NoError(t, os.Mkdir(p, d.mode))
		require.NoError(t, os.Chmod(p, d.mode))
		require.NoError(t, os.Chown(p, int(d.u.uid), int(d.u.gid)))
	}
	// A model to write: the sample's view, read by root from a read-only
	// mount, in a file every user may read.
	ro := mountAllowOther(t, sample)
	model := filepath.Join(top, "model.safetensors")
	b, err := os.ReadFile(filepath.Join(ro, "ckpt", "model.safetensors"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(model, b, 0o644))

	mnt := mountAllowOther(t, src, "--rw")
	runCases(t, mnt, []permCase{
		{name: "mkdir in root's 0755", as: nobody, argv: []string{"mkdir", "{mnt}/roots/n"}, want: denied},
		{name: "mkdir in alice's 0755", as: nobody, argv: []string{"mkdir", "{mnt}/alices/n"}, want: denied},
		{name: "mkdir in the root", as: nobody, argv: []string{"mkdir", "{mnt}/n"}, want: denied},
		{name: "mkdir in a 0777", as: nobody, argv: []string{"mkdir", "{mnt}/shared/n"}},
		{name: "write into it", as: nobody, argv: []string{"cp", model, "{mnt}/shared/n/model.safetensors"}},
		{name: "mkdir in one's own", as: alice, argv: []string{"mkdir", "{mnt}/alices/a"}},
		{name: "write into another's", as: alice, argv: []string{"cp", model, "{mnt}/shared/n/other.safetensors"}, want: denied},
	})
	for _, d := range []struct {
		dir string
		u   user
	}{{"shared/n", nobody}, {"alices/a", alice}} {
		fi, err := os.Stat(filepath.Join(src, d.dir))
		require.NoError(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		require.Equal(t, d.u, user{st.Uid, st.Gid}, d.dir)
	}
	_, err = os.Stat(filepath.Join(src, "roots", "n"))
	require.ErrorIs(t, err, os.ErrNotExist)
	// The committed checkpoint is the writer's, file by file.
	ents, err := os.ReadDir(filepath.Join(src, "shared", "n"))
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		fi, err := e.Info()
		require.NoError(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		require.Equal(t, nobody, user{st.Uid, st.Gid}, e.Name())
		names = append(names, e.Name())
	}
	require.Contains(t, names, ".metadata")
	require.Contains(t, names, "__0_0.distcp")
	// And reads back as written, for the writer.
	out, err := as(nobody, "cat", filepath.Join(mnt, "shared", "n", "model.safetensors"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(b, out), "the written checkpoint reads back other bytes")
}

// TestMountObjectOwners: an object store keeps no owners; --uid, --gid,
// --file-mode and --dir-mode (or -o uid=,...) say what the mount shows,
// the mounter's 0444/0555 by default, and the kernel holds users to them.
func TestMountObjectOwners(t *testing.T) {
	testenv.RequireSystem(t, os.Geteuid() == 0, "root (acting as other users)")
	g := s3test.StartGateway(t, s3test.GatewayOptions{})
	g.Bucket(t, "owners")
	g.Upload(t, "owners", "run/ckpt", filepath.Join(sample, "ckpt"))
	for _, tc := range []struct {
		name      string
		flags     []string
		u         user
		file, dir os.FileMode
		cases     []permCase
	}{
		{"default", nil, root, 0o444, 0o555, []permCase{
			{name: "anyone reads", as: nobody, argv: []string{"cat", "{mnt}/ckpt/model.safetensors"}, same: true},
		}},
		{"flags", []string{"--uid", "4242", "--gid", "4242", "--file-mode", "0440", "--dir-mode", "0550"}, alice, 0o440, 0o550, []permCase{
			{name: "owner reads", as: alice, argv: []string{"cat", "{mnt}/ckpt/model.safetensors"}, same: true},
			{name: "other refused", as: nobody, argv: []string{"cat", "{mnt}/ckpt/config.json"}, want: denied},
			{name: "other cannot list", as: nobody, argv: []string{"ls", "{mnt}/ckpt"}, want: denied},
		}},
		{"options", []string{"-o", "uid=4242,gid=4242,file_mode=400,dir_mode=0o500"}, alice, 0o400, 0o500, []permCase{
			{name: "owner reads", as: alice, argv: []string{"cat", "{mnt}/ckpt/config.json"}, same: true},
			{name: "other refused", as: nobody, argv: []string{"ls", "{mnt}/ckpt"}, want: denied},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mnt := mountAllowOther(t, "s3://owners/run", append([]string{"--cache-size", "32MiB"}, tc.flags...)...)
			for name, perm := range map[string]os.FileMode{"ckpt": tc.dir, "ckpt/model.safetensors": tc.file, "ckpt/config.json": tc.file} {
				fi, err := os.Stat(filepath.Join(mnt, name))
				require.NoError(t, err, name)
				st := fi.Sys().(*syscall.Stat_t)
				require.Equal(t, perm, fi.Mode().Perm(), name)
				require.Equal(t, tc.u, user{st.Uid, st.Gid}, name)
			}
			runCases(t, mnt, tc.cases)
		})
	}
}

// TestOwnerFlagsRefused: hostile or misplaced owner flags are one usage
// error naming the flag.
func TestOwnerFlagsRefused(t *testing.T) {
	mnt := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--uid", "-1"}, `invalid argument "-1" for "--uid"`},
		{[]string{"--uid", "4294967295"}, "not a user or group id"},
		{[]string{"--gid", "99999999999"}, "not a user or group id"},
		{[]string{"--gid", "0x10"}, "not a user or group id"},
		{[]string{"--uid", ""}, "not a user or group id"},
		{[]string{"--file-mode", "0644"}, "write bits"},
		{[]string{"--dir-mode", "0777"}, "write bits"},
		{[]string{"--file-mode", "01444"}, "not a mode"},
		{[]string{"--file-mode", "0999"}, "not a mode"},
		{[]string{"--dir-mode", "r-x"}, "not a mode"},
		{[]string{"--dir-mode", "-0555"}, "not a mode"},
		{[]string{"--stats-mode", "0600"}, "write bits"},
		{[]string{"-o", "stats_mode=8"}, "not a mode"},
		{[]string{"-o", "uid=abc"}, `mount option "uid=abc"`},
		{[]string{"-o", "file_mode=0666"}, "write bits"},
		{[]string{"-o", "file_mode"}, `mount option "file_mode" needs a value`},
		{[]string{"-o", "uid=1\\,2"}, "not a user or group id"},
	} {
		code, _, errs := runCLI(append(append([]string{"mount"}, tc.args...), "s3://b/p", mnt)...)
		require.Equal(t, 2, code, "%v: %s", tc.args, errs)
		require.Contains(t, errs, tc.want, tc.args)
		require.Equal(t, 2, strings.Count(errs, "\n"), "%v: one error line, then the usage hint: %s", tc.args, errs)
	}
	code, _, errs := runCLI("mount", "--uid", "1000", sample, mnt)
	require.Equal(t, 2, code, errs)
	require.Contains(t, errs, "--uid is for object store sources")
}

// FuzzOwnerValues: --uid/--gid and --file-mode/--dir-mode values never
// panic, and what is accepted is in range and reads back as given.
func FuzzOwnerValues(f *testing.F) {
	for _, s := range []string{"0", "1000", "4294967295", "-1", "0444", "0o555", "777", "01444", "", "0x10", "+7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var id idValue
		if err := id.Set(s); err == nil {
			var again idValue
			require.NoError(t, again.Set(id.String()))
			require.Equal(t, id, again)
			require.NotEqual(t, uint32(1<<32-1), id.id)
		}
		var m modeValue
		if err := m.Set(s); err == nil {
			require.Zero(t, uint32(m)&^0o555, "%q", s)
			var again modeValue
			require.NoError(t, again.Set(m.String()))
			require.Equal(t, m, again)
		}
	})
}
