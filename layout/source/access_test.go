package source

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func acc(uid, gid uint32, perm fs.FileMode) Access {
	return Access{Uid: uid, Gid: gid, Perm: perm, Known: true}
}

// users are the kinds of user Intersect must answer for: owners, group
// members and others of each input, in every combination.
var users = []Caller{
	{Uid: 1000, Gid: 100}, {Uid: 1001, Gid: 100}, {Uid: 1002, Gid: 101},
	{Uid: 1000, Gid: 101}, {Uid: 1001, Gid: 101, Groups: []uint32{100}},
	{Uid: 1003, Gid: 102}, {Uid: 1003, Gid: 102, Groups: []uint32{100, 101}},
	{Uid: 1000, Gid: 102, Groups: []uint32{101}},
}

// TestIntersectGrantsNoMore: whoever the result lets read, write or search
// is let by every input; inputs that agree lose nothing.
func TestIntersectGrantsNoMore(t *testing.T) {
	modes := []fs.FileMode{0o600, 0o640, 0o644, 0o604, 0o060, 0o007, 0o755, 0o700, 0o444, 0o000, 0o077}
	owners := [][2]uint32{{1000, 100}, {1001, 100}, {1000, 101}, {1002, 101}}
	for _, m1 := range modes {
		for _, m2 := range modes {
			for _, o1 := range owners {
				for _, o2 := range owners {
					a, b := acc(o1[0], o1[1], m1), acc(o2[0], o2[1], m2)
					r := Intersect(a, b)
					for _, u := range users {
						for _, want := range []uint32{MayRead, MayWrite, MayExec} {
							if r.Allows(u, want) {
								require.True(t, a.Allows(u, want) && b.Allows(u, want), "%v ∩ %v = %v lets %+v do %d", a, b, r, u, want)
							}
						}
					}
				}
			}
		}
	}
	for _, m := range modes {
		a := acc(1000, 100, m)
		require.Equal(t, a, Intersect(a, a, a))
		require.Equal(t, a, Intersect(a))
	}
	require.Equal(t, acc(1000, 100, 0o640), Intersect(acc(1000, 100, 0o644), acc(1000, 100, 0o640)))
	// Mixed owners: the other owner's file is not readable by "others", nor
	// by the first owner, who may not be in its group: the second owner
	// keeps more.
	require.Equal(t, acc(1001, 100, 0o440), Intersect(acc(1000, 100, 0o644), acc(1001, 100, 0o640)))
	require.Equal(t, acc(1000, 100, 0o444), Intersect(acc(1000, 100, 0o644), acc(1001, 101, 0o644)))
	require.Equal(t, acc(1001, 100, 0o400), Intersect(acc(1000, 100, 0o644), acc(1001, 100, 0o600)))
	require.Equal(t, acc(1000, 100, 0o000), Intersect(acc(1000, 100, 0o600), acc(1001, 100, 0o600)))
	require.False(t, Intersect(acc(1000, 100, 0o444), Access{}).Known)
}

func TestAllows(t *testing.T) {
	a := acc(1000, 100, 0o750)
	require.True(t, a.Allows(Caller{Uid: 1000, Gid: 5}, MayRead|MayWrite|MayExec))
	require.True(t, a.Allows(Caller{Uid: 7, Gid: 5, Groups: []uint32{100}}, MayRead|MayExec))
	require.False(t, a.Allows(Caller{Uid: 7, Gid: 5, Groups: []uint32{100}}, MayWrite))
	require.False(t, a.Allows(Caller{Uid: 7, Gid: 5}, MayRead))
	require.True(t, a.Allows(Caller{Uid: 0}, MayWrite))
	// The owner class decides even where group or other would grant more.
	require.False(t, acc(1000, 100, 0o077).Allows(Caller{Uid: 1000, Gid: 100}, MayRead))
}

func TestParseGroups(t *testing.T) {
	g, err := parseGroups("Name:\tx\nGroups:\t4 24 27 \nNSpid:\t1\n")
	require.NoError(t, err)
	require.Equal(t, []uint32{4, 24, 27}, g)
	g, err = parseGroups("Groups:\n")
	require.NoError(t, err)
	require.Empty(t, g)
	for _, bad := range []string{"", "Name: x\n", "Groups: 1 x\n", "Groups: -1\n", "Groups: 4294967296\n"} {
		_, err := parseGroups(bad)
		require.Error(t, err, "%q", bad)
	}
	own, err := CallerGroups(uint32(os.Getpid()))
	require.NoError(t, err)
	want, err := syscall.Getgroups()
	require.NoError(t, err)
	require.Len(t, own, len(want))
}

func FuzzParseGroups(f *testing.F) {
	f.Add("Groups:\t4 24 27\n")
	f.Add("Groups: 99999999999999999999\n")
	f.Fuzz(func(t *testing.T, s string) {
		g, err := parseGroups(s)
		if err == nil && len(g) > maxGroups {
			t.Fatalf("%d groups", len(g))
		}
	})
}

// TestLocalAccess: a local tree reports each file's owner, group and mode;
// a file with an ACL its owner's bits only.
func TestLocalAccess(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a"), []byte("x"), 0o640))
	require.NoError(t, os.Chmod(filepath.Join(dir, "a"), 0o640))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "d"), 0o711))
	require.NoError(t, os.Chmod(filepath.Join(dir, "d"), 0o711))
	l, err := OpenLocal(dir)
	require.NoError(t, err)
	defer l.Close()
	me := Caller{Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid())}
	info, err := l.Stat("a")
	require.NoError(t, err)
	require.Equal(t, acc(me.Uid, me.Gid, 0o640), info.Access)
	f, err := l.Open("a")
	require.NoError(t, err)
	require.Equal(t, info.Access, f.Info().Access)
	f.Close()
	ents, err := l.ReadDir(".")
	require.NoError(t, err)
	require.Equal(t, info.Access, ents[0].Access)
	require.Equal(t, acc(me.Uid, me.Gid, 0o711), ents[1].Access)

	// An access ACL (user::rw- user:12345:r-- group::r-- mask::r-- other::---):
	// its named user is not the file's group, so only the owner's bits stay.
	aclXattr := []byte{2, 0, 0, 0,
		1, 0, 6, 0, 0xff, 0xff, 0xff, 0xff,
		2, 0, 4, 0, 0x39, 0x30, 0, 0,
		4, 0, 4, 0, 0xff, 0xff, 0xff, 0xff,
		0x10, 0, 4, 0, 0xff, 0xff, 0xff, 0xff,
		0x20, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}
	if err := unix.Setxattr(filepath.Join(dir, "a"), aclName, aclXattr, 0); err != nil {
		t.Logf("no ACLs here: %v", err)
		return
	}
	info, err = l.Stat("a")
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), info.Access.Perm)
	f, err = l.Open("a")
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), f.Info().Access.Perm)
	f.Close()
}

// TestLocalAccessThroughLinks: a name reached through a link is readable
// only by whom may search the directories the link leads through.
func TestLocalAccessThroughLinks(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "private", "step"), 0o755))
	require.NoError(t, os.Chmod(filepath.Join(dir, "private"), 0o711))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "private", "step", "f"), nil, 0o644))
	require.NoError(t, os.Chmod(filepath.Join(dir, "private", "step", "f"), 0o644))
	require.NoError(t, os.Symlink("private/step", filepath.Join(dir, "latest")))
	l, err := OpenLocal(dir)
	require.NoError(t, err)
	defer l.Close()
	// Searchable by all (0711): nothing is taken away.
	for name, want := range map[string]fs.FileMode{"latest": 0o755, "latest/f": 0o644} {
		info, err := l.Stat(name)
		require.NoError(t, err)
		require.Equal(t, want, info.Access.Perm, name)
	}
	require.NoError(t, os.Chmod(filepath.Join(dir, "private"), 0o700))
	for name, want := range map[string]fs.FileMode{"latest": 0o700, "latest/f": 0o600, "private/step/f": 0o644} {
		info, err := l.Stat(name)
		require.NoError(t, err)
		require.Equal(t, want, info.Access.Perm, name)
	}
}
