package hfwrite

import (
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/layout/hfdir"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
)

// Kind is how a written file is committed.
type Kind int

const (
	// SidecarFile is stored as-is.
	SidecarFile Kind = iota
	// TensorFile (*.safetensors) is resharded into DCP shards.
	TensorFile
	// IndexFile (*.safetensors.index.json) is checked against the tensors
	// received.
	IndexFile
)

// CheckName returns an error for a name that cannot be an entry of a
// directory: empty, "." or "..", with a slash or NUL, or longer than
// NAME_MAX (wrapping syscall.ENAMETOOLONG). It is the one check of names
// created in a write target (files by KindOf, directories by the mount).
func CheckName(name string) error {
	switch {
	case name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("hfwrite: invalid file name %q", name)
	case len(name) > unix.NAME_MAX: // fails where created, not when a commit renames it into place
		return fmt.Errorf("hfwrite: %.32q... (%d bytes): %w", name, len(name), syscall.ENAMETOOLONG)
	}
	return nil
}

// KindOf returns how a file of the given name is committed, or ErrReserved.
func KindOf(name string) (Kind, error) {
	if err := CheckName(name); err != nil {
		return 0, err
	}
	switch {
	case name == SpoolDir || torchdcp.IsInternal(name) || torchdcp.IsRankLocalMetadata(name):
		return 0, fmt.Errorf("%w: %q", ErrReserved, name)
	}
	switch hfdir.KindOf(name) {
	case hfdir.Index:
		return IndexFile, nil
	case hfdir.Weights:
		return TensorFile, nil
	}
	return SidecarFile, nil
}

// Hidden reports whether name, in a directory written by a session, is the
// session's or the checkpoint's own (the spool, .metadata, shard files): a
// directory listing leaves it out. Beside a spool that a killed session
// left, those names are its debris, hidden in every mode.
func Hidden(name string) bool { return name == SpoolDir || torchdcp.IsInternal(name) }
