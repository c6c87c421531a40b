package source

import (
	"errors"
	"fmt"
	"io/fs"
	"math/bits"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Access is who may read, write and search a file or directory of a tree:
// its owner, group and permission bits, as the kernel checks them. A mount
// shows each name with the Access of what it is made of (see Intersect), so
// that it never lets a user do more than the source would.
type Access struct {
	Uid, Gid uint32
	Perm     fs.FileMode // owner, group and other rwx bits; nothing else
	// Known: the tree keeps owners and modes (a local directory). An
	// object store keeps none: the mount's options say what it shows.
	Known bool
}

// Permission bits one class of users may be granted.
const (
	MayRead  = 4
	MayWrite = 2
	MayExec  = 1
)

// ReadOnly is a without its write bits.
func (a Access) ReadOnly() Access {
	a.Perm &^= 0o222
	return a
}

// AsFile is the Access of a file made from the directory a (a generated
// config.json, an index): read where the directory may be read, never
// executed or written.
func (a Access) AsFile() Access {
	a.Perm &= 0o444
	return a
}

func (a Access) String() string {
	return fmt.Sprintf("%d:%d %#o", a.Uid, a.Gid, uint32(a.Perm))
}

// class returns the bits of class (0 owner, 1 group, 2 other).
func (a Access) class(c uint) uint32 { return uint32(a.Perm>>(3*(2-c))) & 7 }

// Intersect is an Access that grants a user no more than every one of
// accs grants them: a view file built from several shards is readable
// only by whom every shard is readable by. Its owner and group are those
// of one input (intersectAs): of the inputs' owners and groups, the one
// that grants the most bits, the first of those that tie.
func Intersect(accs ...Access) Access {
	if len(accs) == 0 {
		return Access{}
	}
	best := intersectAs(accs[0].Uid, accs[0].Gid, accs)
	seen := map[[2]uint32]bool{{best.Uid, best.Gid}: true}
	for _, a := range accs[1:] {
		if seen[[2]uint32{a.Uid, a.Gid}] {
			continue
		}
		seen[[2]uint32{a.Uid, a.Gid}] = true
		if c := intersectAs(a.Uid, a.Gid, accs); bits.OnesCount32(uint32(c.Perm)) > bits.OnesCount32(uint32(best.Perm)) {
			best = c
		}
	}
	return best
}

// intersectAs is Intersect with owner uid and group gid. A user shown a
// class of it gets the bits every input could give a user of that class,
// whichever class of that input the user falls in (what is not known of a
// user, such as whether the owner of the result is in another input's
// group, counts against them):
//
//   - owner: an input of the same owner gives its owner bits; any other
//     its group and other bits, both;
//   - group: an input of the same group gives its group bits, any other
//     its group and other bits; an input of another owner also its owner
//     bits (a member may be that owner);
//   - other: its other bits, and the group bits of an input of another
//     group and the owner bits of an input of another owner.
//
// Inputs that agree on owner and group intersect bit by bit; one input is
// itself. An input that is not Known makes the result not Known.
func intersectAs(uid, gid uint32, accs []Access) Access {
	out := Access{Uid: uid, Gid: gid, Known: true}
	own, grp, oth := uint32(7), uint32(7), uint32(7)
	for _, a := range accs {
		if !a.Known {
			out.Known = false
		}
		o, g, x := a.class(0), a.class(1), a.class(2)
		sameOwner, sameGroup := a.Uid == out.Uid, a.Gid == out.Gid
		if sameOwner {
			own &= o
		} else {
			own &= g & x
			grp &= o
			oth &= o
		}
		if sameGroup {
			grp &= g
		} else {
			grp &= g & x
			oth &= g
		}
		oth &= x
	}
	out.Perm = fs.FileMode(own<<6 | grp<<3 | oth)
	return out
}

// Caller is a user asking the mount for something: the FUSE request's
// uid and gid, and the supplementary groups of its process.
type Caller struct {
	Uid, Gid uint32
	Groups   []uint32
}

// Allows reports whether c may do want (MayRead, MayWrite, MayExec, or'd)
// to a name of Access a, as the kernel decides with default_permissions:
// root may do anything (it is asked of directories only); otherwise the
// first class c falls in (owner, group, other) says.
func (a Access) Allows(c Caller, want uint32) bool {
	if c.Uid == 0 {
		return true
	}
	var bits uint32
	switch {
	case c.Uid == a.Uid:
		bits = a.class(0)
	case c.inGroup(a.Gid):
		bits = a.class(1)
	default:
		bits = a.class(2)
	}
	return bits&want == want
}

func (c Caller) inGroup(gid uint32) bool {
	if c.Gid == gid {
		return true
	}
	for _, g := range c.Groups {
		if g == gid {
			return true
		}
	}
	return false
}

// maxGroups bounds the supplementary groups read for a caller (the
// kernel's NGROUPS_MAX).
const maxGroups = 65536

// CallerGroups reads the supplementary groups of process pid from
// /proc/PID/status (its Groups: line). A process gone, or a line that does
// not parse, is an error: the caller is then checked without groups, which
// grants no more.
func CallerGroups(pid uint32) ([]uint32, error) {
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/status")
	if err != nil {
		return nil, err
	}
	return parseGroups(string(b))
}

// parseGroups reads the Groups: line of a /proc/PID/status.
func parseGroups(status string) ([]uint32, error) {
	for _, line := range strings.Split(status, "\n") {
		rest, ok := strings.CutPrefix(line, "Groups:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) > maxGroups {
			return nil, fmt.Errorf("source: %d groups (at most %d)", len(fields), maxGroups)
		}
		out := make([]uint32, 0, len(fields))
		for _, f := range fields {
			g, err := strconv.ParseUint(f, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("source: group %q: %w", f, err)
			}
			out = append(out, uint32(g))
		}
		return out, nil
	}
	return nil, errors.New("source: no Groups: line")
}

// accessOf is the Access of a stat result, before ACLs (withACL).
func accessOf(sys any) Access {
	st, ok := sys.(*syscall.Stat_t)
	if !ok {
		return Access{}
	}
	return Access{Uid: st.Uid, Gid: st.Gid, Perm: fs.FileMode(st.Mode & 0o777), Known: true}
}

// aclName is the extended attribute that holds a POSIX access ACL.
const aclName = "system.posix_acl_access"

// withACL narrows a for a file with a POSIX access ACL (hasACL). ACL
// entries are not read: a named user's or group's entry may grant less
// than the group or other bits of the mode (which then hold the mask), so
// such a file is shown with its owner's bits only. An ACL never widens
// what a mount shows.
func withACL(a Access, hasACL bool) Access {
	if hasACL {
		a.Perm &= 0o700
	}
	return a
}

// aclResult says, from getxattr's answer, whether a file has an access
// ACL: no attribute, or a filesystem without ACLs, is none; any other
// failure to tell counts as one (narrower, never wider).
func aclResult(n int, err error) bool {
	switch {
	case err == nil:
		return n > 0
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EOPNOTSUPP):
		return false
	}
	return true
}

// pathHasACL reports whether the file at path has an access ACL.
func pathHasACL(path string) bool {
	n, err := unix.Getxattr(path, aclName, nil)
	return aclResult(n, err)
}

// fdHasACL reports whether the open file fd has an access ACL.
func fdHasACL(fd int) bool {
	n, err := unix.Fgetxattr(fd, aclName, nil)
	return aclResult(n, err)
}

// throughLinks narrows a, the Access of name, by the directories a link on
// name's path leads through: a mount shows `latest` (a link to
// private/step_100) as step_100, and the kernel checks the directories of
// the mount's path (the tree's top, then latest), not private, which the
// link passes through in the source. So a name whose path resolves through
// a link is shown readable only by whom may also search every directory of
// the path it resolves to. A name without links costs three syscalls
// (realPath).
func (l *Local) throughLinks(name string, a Access) Access {
	real := l.real(name)
	resolved, err := realPath(real)
	if err != nil {
		return Access{Uid: a.Uid, Gid: a.Gid, Known: true} // cannot tell: no one but root
	}
	if resolved == real {
		return a
	}
	rel, err := filepath.Rel(l.dir, resolved)
	if err != nil || !filepath.IsLocal(rel) {
		return Access{Uid: a.Uid, Gid: a.Gid, Known: true}
	}
	accs := []Access{a}
	for dir := filepath.Dir(rel); dir != "."; dir = filepath.Dir(dir) {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(l.dir, dir), &st); err != nil {
			return Access{Uid: a.Uid, Gid: a.Gid, Known: true}
		}
		d := withACL(accessOf(&syscall.Stat_t{Uid: st.Uid, Gid: st.Gid, Mode: st.Mode}), pathHasACL(filepath.Join(l.dir, dir)))
		accs = append(accs, SearchMask(d))
	}
	return Intersect(accs...)
}

// SearchMask is an Access that grants a class everything where the
// directory d lets it search, and nothing where not: what passing through
// d takes away, to Intersect with what lies below it.
func SearchMask(d Access) Access {
	var p fs.FileMode
	for c := uint(0); c < 3; c++ {
		if d.class(c)&MayExec != 0 {
			p |= 7 << (3 * (2 - c))
		}
	}
	d.Perm = p
	return d
}

// realPath is the path the kernel resolves p to, links followed: the name
// of an O_PATH descriptor of it (which opens nothing: no device is
// touched). It only says which directories a link leads through; what is
// read is read through os.Root.
func realPath(p string) (string, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	return os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
}
