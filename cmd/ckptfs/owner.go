package main

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/ckptfs/ckptfs/vfs"
)

// ownerFlags say who owns what an object store shows, as mountpoint-s3's
// and gcsfuse's flags of the same names do: a store keeps no owners or
// modes. A local source shows its own (vfs/attr.go), so they are refused
// there.
type ownerFlags struct {
	uid, gid          idValue
	fileMode, dirMode modeValue
	statsMode         modeValue // .ckptfs, any source
	flags             *pflag.FlagSet
}

var ownerFlagNames = []string{"uid", "gid", "file-mode", "dir-mode"}

func (o *ownerFlags) register(fs *pflag.FlagSet) {
	o.flags = fs
	def := vfs.DefaultObjects()
	o.fileMode, o.dirMode = modeValue(def.FileMode), modeValue(def.DirMode)
	fs.Var(&o.uid, "uid", "object store sources: `UID` that owns every file and directory shown (default: the mounter's)")
	fs.Var(&o.gid, "gid", "object store sources: `GID` that owns every file and directory shown (default: the mounter's)")
	fs.Var(&o.fileMode, "file-mode", "object store sources: permission bits of every file, in octal, without write bits (the mount is read-only)")
	fs.Var(&o.dirMode, "dir-mode", "object store sources: permission bits of every directory, in octal, without write bits")
	o.statsMode = 0o400
	fs.Var(&o.statsMode, "stats-mode", "permission bits of .ckptfs (owned by the mounter; it names every checkpoint opened), in octal, without write bits")
}

// stats is the mode of .ckptfs.
func (o *ownerFlags) stats() fs.FileMode { return fs.FileMode(o.statsMode) }

// objects is what the flags say an object store shows; nil for a local
// source, where giving any of them is an error.
func (o *ownerFlags) objects(remote bool) (*vfs.Objects, error) {
	if !remote {
		for _, name := range ownerFlagNames {
			if o.flags.Changed(name) {
				return nil, &usageError{fmt.Errorf("--%s is for object store sources: a local source shows its own owners and modes", name)}
			}
		}
		return nil, nil
	}
	obj := vfs.DefaultObjects()
	if o.uid.set {
		obj.Uid = o.uid.id
	}
	if o.gid.set {
		obj.Gid = o.gid.id
	}
	obj.FileMode, obj.DirMode = fs.FileMode(o.fileMode), fs.FileMode(o.dirMode)
	return &obj, nil
}

// idValue is a uid or gid: a decimal number below 2^32-1 (which is -1, no
// id, to chown(2)). Unset, it is the mounter's (not printed in --help,
// which would then differ between users).
type idValue struct {
	id  uint32
	set bool
}

func (v *idValue) String() string {
	if !v.set {
		return ""
	}
	return strconv.FormatUint(uint64(v.id), 10)
}

func (v *idValue) Type() string { return "string" } // placeholders come from the usage

func (v *idValue) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == math.MaxUint32 {
		return fmt.Errorf("%q is not a user or group id (a decimal number below %d)", s, uint64(math.MaxUint32))
	}
	*v = idValue{id: uint32(n), set: true}
	return nil
}

// modeValue is the permission bits of a read-only file or directory, in
// octal ("0444", "444" or "0o444").
type modeValue fs.FileMode

func (v *modeValue) String() string { return fmt.Sprintf("%04o", uint32(*v)) }
func (v *modeValue) Type() string   { return "string" }

var errWriteBits = errors.New("has write bits: what it sets cannot be written")

func (v *modeValue) Set(s string) error {
	digits := strings.TrimPrefix(s, "0o")
	n, err := strconv.ParseUint(digits, 8, 32)
	if err != nil || n > 0o777 {
		return fmt.Errorf("%q is not a mode (octal permission bits, 0 to 0777)", s)
	}
	if n&0o222 != 0 {
		return fmt.Errorf("%s %w", s, errWriteBits)
	}
	*v = modeValue(n)
	return nil
}
