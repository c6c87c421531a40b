package vfs

// Who may do what in a mount. Every node shows the owner, group and mode of
// what it is made of, and the kernel checks each access against them
// (default_permissions is always on, mount.go), so a mount never lets a
// user do more than the source would:
//
//   - a directory or file of a local source shows its own (source.Access,
//     narrowed where it has an ACL), without write bits; the mount root
//     shows the source directory's, as it was at mount time;
//   - a checkpoint's view directory is its source directory, and shows it;
//   - a view file built from source files shows source.Intersect of theirs:
//     a user may read it only where they may read every one of them; a
//     generated file (config.json written from the checkpoint's arguments,
//     an index) follows the checkpoint directory (Access.AsFile);
//   - an object store keeps no owners: the mount's Objects say;
//   - in a writable mount, a directory that may take new checkpoints keeps
//     its write bits (the kernel then checks the writer against them, and
//     Mkdir again, as.go), and a write target's files show its owner;
//   - .ckptfs and CKPTFS_* notes: the stats file is the mounter's alone
//     (0400); a note follows its checkpoint directory.

import (
	"io/fs"
	"os"
	"path"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/view"
)

// Objects is what a source that keeps no owners (an object store) shows:
// every file and directory is Uid:Gid with FileMode or DirMode.
type Objects struct {
	Uid, Gid          uint32
	FileMode, DirMode fs.FileMode
}

// DefaultObjects is the mounter's, 0444 and 0555, as mountpoint-s3 and
// gcsfuse show a read-only bucket.
func DefaultObjects() Objects {
	return Objects{Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid()), FileMode: 0o444, DirMode: 0o555}
}

// mounterOnly is the Access of what only the mounter may read: the stats
// file, and what cannot be told (a checkpoint directory that failed to
// stat while its note was made).
func mounterOnly() source.Access {
	return source.Access{Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid()), Perm: 0o400, Known: true}
}

// access is what info shows: its own Access, or the Objects' for a tree
// that keeps none.
func (f *FS) access(info source.Info) source.Access {
	return f.known(info.Access, info.IsDir())
}

// known is a, or the Objects' Access where a is not known.
func (f *FS) known(a source.Access, dir bool) source.Access {
	if a.Known {
		return a
	}
	o := f.objects
	a = source.Access{Uid: o.Uid, Gid: o.Gid, Perm: o.FileMode, Known: true}
	if dir {
		a.Perm = o.DirMode
	}
	return a
}

// viewAccess is what the view file vf of the checkpoint directory ckpt,
// of Access dir, shows (see the top of this file). A source file in a
// subdirectory of the checkpoint (a pipeline stage's mp_rank_01/) counts
// with the search bits of the directories on its way, which the kernel
// does not see: they are no part of the view's path. masks caches those,
// for the files of one view.
func (f *FS) viewAccess(vf *view.File, ckpt string, dir source.Access, masks map[string]source.Access) source.Access {
	srcs := vf.Sources()
	if len(srcs) == 0 {
		return dir.AsFile()
	}
	var accs []source.Access
	for _, s := range srcs {
		accs = append(accs, f.known(s.Access(), false))
		for d := path.Dir(s.Rel); d != "." && d != "/" && d != ".."; d = path.Dir(d) {
			m, ok := masks[d]
			if !ok {
				m = source.SearchMask(f.dirAccess(path.Join(ckpt, d)))
				masks[d] = m
			}
			accs = append(accs, m)
		}
	}
	return source.Intersect(accs...).ReadOnly()
}

// dirAccess is what the checkpoint directory dir shows, for the files made
// from it; mounterOnly when it cannot be stat'ed.
func (f *FS) dirAccess(dir string) source.Access {
	info, err := f.tree.Stat(dir)
	if err != nil {
		return mounterOnly()
	}
	return f.access(info)
}

// showAccess puts a's owner, group and permission bits into attributes
// setAttr filled.
func showAccess(out *fuse.Attr, a source.Access) {
	out.Uid, out.Gid = a.Uid, a.Gid
	out.Mode = out.Mode&^0o7777 | uint32(a.Perm&fs.ModePerm)
}

// access is what a file of t shows: its owner's, with perm.
func (t *target) access(perm fs.FileMode) source.Access {
	return source.Access{Uid: t.uid, Gid: t.gid, Perm: perm, Known: true}
}
