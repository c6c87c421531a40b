package vfs

// Who may do what in a mount. Every node shows the owner, group and mode of
// what it is made of, and the kernel checks each access against them
// (default_permissions is always on, mount.go), so a mount never lets a
// user do more than the source would:
//
//   - a directory or file of a local source shows its own (source.Access,
//     narrowed where it has an ACL or is reached through a link), without
//     write bits; the mount root shows the source directory's, as it was
//     at mount time;
//   - a checkpoint's view directory is its source directory, and shows it;
//   - a view file shows source.Intersect of the files it is made of: those
//     its bytes come from and those the reader opened to plan the view
//     (.metadata, Megatron's arguments), so a user may read it only where
//     they may read every one of them; a generated file (config.json
//     written from the checkpoint's arguments, an index) also the
//     checkpoint directory's read bits (Access.AsFile); a sidecar shown as
//     it is, its own (viewAccess);
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
	"sync"

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

// statsAccess is what .ckptfs shows: the mounter's, Options.StatsMode.
func (f *FS) statsAccess() source.Access {
	a := mounterOnly()
	if f.opts.StatsMode != 0 {
		a.Perm = f.opts.StatsMode &^ 0o222
	}
	return a
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

// viewAccess is what each file of v, the view of the checkpoint directory
// ckpt, shows (see the top of this file), in the order of v.Files: the
// intersection of the files its bytes come from and of every file the
// reader opened to plan the view (read: .metadata, Megatron's arguments,
// sidecars; the safetensors header, the index and a generated config.json
// are made of them), and, for a file made of nothing else, the checkpoint
// directory's. A sidecar shown as it is (KindPassthrough) is its file's. A file in a subdirectory (a rank's mp_rank_01/) counts with
// the search bits of the directories on its way, which the kernel does not
// see: they are no part of the view's path.
func (f *FS) viewAccess(ckpt string, v *view.View, read *readFiles) []source.Access {
	masks := map[string]source.Access{}
	withPath := func(accs []source.Access, rel string, a source.Access) []source.Access {
		accs = append(accs, f.known(a, false))
		for d := path.Dir(rel); d != "." && d != "/" && d != ".."; d = path.Dir(d) {
			m, ok := masks[d]
			if !ok {
				m = source.SearchMask(f.dirAccess(path.Join(ckpt, d)))
				masks[d] = m
			}
			accs = append(accs, m)
		}
		return accs
	}
	var planned []source.Access
	for rel, a := range read.files() {
		planned = withPath(planned, rel, a)
	}
	dir := f.dirAccess(ckpt)
	out := make([]source.Access, len(v.Files))
	for n, vf := range v.Files {
		var accs []source.Access
		if vf.Kind != view.KindPassthrough { // a sidecar is its file's bytes alone
			accs = append(accs, planned...)
		}
		for _, s := range vf.Sources() {
			accs = withPath(accs, s.Rel, s.Access())
		}
		if len(vf.Sources()) == 0 {
			accs = append(accs, dir.AsFile())
		}
		out[n] = source.Intersect(accs...).ReadOnly()
	}
	return out
}

// readFiles records the files a checkpoint's reader opens while its view
// is planned, by name in the checkpoint, with their Access.
type readFiles struct {
	mu      sync.Mutex
	opened  map[string]source.Access // GUARDED_BY(mu)
	stopped bool                     // GUARDED_BY(mu)
}

// tree is t, recording its opens into r; t itself where r is nil.
func (r *readFiles) tree(t source.Tree) source.Tree {
	if r == nil {
		return t
	}
	return &recordingTree{Tree: t, r: r}
}

// stop ends the recording: the shards opened later, to be read, are
// counted by the view files they make (view.File.Sources).
func (r *readFiles) stop() {
	if r != nil {
		r.mu.Lock()
		r.stopped = true
		r.mu.Unlock()
	}
}

func (r *readFiles) files() map[string]source.Access {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.opened
}

type recordingTree struct {
	source.Tree
	r *readFiles
}

// Open records name with the Access a Stat gives (narrowed by the links
// on its way, which the open file's own does not say).
func (t *recordingTree) Open(name string) (source.File, error) {
	file, err := t.Tree.Open(name)
	if err != nil {
		return nil, err
	}
	a := file.Info().Access
	if info, err := t.Tree.Stat(name); err == nil {
		a = info.Access
	} else {
		a.Perm = 0 // cannot tell: root's alone
	}
	t.r.mu.Lock()
	if !t.r.stopped {
		if t.r.opened == nil {
			t.r.opened = map[string]source.Access{}
		}
		t.r.opened[name] = a
	}
	t.r.mu.Unlock()
	return file, nil
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
