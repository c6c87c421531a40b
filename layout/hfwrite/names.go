package hfwrite

import (
	"fmt"
	"strings"

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

// KindOf returns how a file of the given name is committed, or ErrReserved.
func KindOf(name string) (Kind, error) {
	switch {
	case name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00"):
		return 0, fmt.Errorf("hfwrite: invalid file name %q", name)
	case name == SpoolDir || torchdcp.IsInternal(name) || torchdcp.IsRankLocalMetadata(name):
		return 0, fmt.Errorf("%w: %q", ErrReserved, name)
	case strings.HasSuffix(name, ".safetensors.index.json"):
		return IndexFile, nil
	case strings.HasSuffix(name, ".safetensors"):
		return TensorFile, nil
	}
	return SidecarFile, nil
}

// Hidden reports whether name, in a directory written by a session, is the
// session's or the checkpoint's own (the spool, .metadata, shard files): a
// directory listing leaves it out. Beside a spool that a killed session
// left, those names are its debris, hidden in every mode.
func Hidden(name string) bool { return name == SpoolDir || torchdcp.IsInternal(name) }
