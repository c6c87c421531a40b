// Package layout is the registry of checkpoint formats: Detect names the
// format of a directory and Open parses its index into a ckpt.Checkpoint,
// whatever wrote it. What is built from a checkpoint lives in the rooms
// below: view plans the HF view of a checkpoint and serves its bytes,
// export writes a view out as a directory, and hfwrite/dcpwrite turn HF
// files written into a mount back into DCP.
package layout

import (
	"context"
	"fmt"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/deepspeed"
	"github.com/ckptfs/ckptfs/layout/hfsharded"
	"github.com/ckptfs/ckptfs/layout/megatron"
	"github.com/ckptfs/ckptfs/layout/megatronlegacy"
	"github.com/ckptfs/ckptfs/layout/metallama"
	"github.com/ckptfs/ckptfs/layout/plainhf"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/open"
	"github.com/ckptfs/ckptfs/layout/stages"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/layout/torchsave"
	"github.com/ckptfs/ckptfs/layout/trainer"
)

// Re-exported model types, so library users need only this package.
type (
	Checkpoint = ckpt.Checkpoint
	Tensor     = ckpt.Tensor
	Chunk      = ckpt.Chunk
	Format     = ckpt.Format
)

// Formats are the checkpoint formats in detection order: the first whose
// Detect accepts a directory opens it. Megatron (DCP plus a metadata.json)
// precedes torch DCP; a directory's own shards precede HF files beside them;
// safetensors precede pytorch_model.bin beside them, as transformers prefers;
// a torch.save state dict under any other name is looked for last, after
// every format that names its files.
var Formats = []ckpt.Reader{
	megatron.Reader,
	torchdcp.Reader,
	hfsharded.Reader,
	plainhf.Reader,
	torchsave.Reader,
	metallama.Reader,
	megatronlegacy.Reader,
	deepspeed.Reader,
	deepspeed.UniversalReader,
	trainer.Reader,
	trainer.FSDPReader,
	stages.Reader,
	torchsave.StateDictReader,
}

// Detect returns the format of the checkpoint in dir, looking at names and
// at most a few small files (cheap enough for every directory lookup of a
// mount). The mount, inspect and export all decide through it.
func Detect(dir source.Tree) (ckpt.Reader, bool) {
	for _, f := range Formats {
		if f.Detect(dir) {
			return f, true
		}
	}
	return nil, false
}

// OpenTree opens the checkpoint in the directory tree dir.
func OpenTree(dir source.Tree) (*Checkpoint, error) {
	return OpenAs(nil, dir)
}

// OpenAs opens the checkpoint in the directory tree dir as format f, which
// Detect found there; nil detects it.
func OpenAs(f ckpt.Reader, dir source.Tree) (*Checkpoint, error) {
	return OpenAsWith(f, dir, ckpt.OpenOptions{})
}

// OpenAsWith is OpenAs with what the caller will use of the checkpoint
// (a format that takes options may leave the rest out).
func OpenAsWith(f ckpt.Reader, dir source.Tree, o ckpt.OpenOptions) (*Checkpoint, error) {
	info, err := dir.Stat(".")
	if err != nil {
		return nil, fmt.Errorf("layout: %w", err)
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("layout: %s is not a directory", dir.Path("."))
	}
	if f != nil {
		return ckpt.OpenWith(f, dir, o)
	}
	f, ok := Detect(dir)
	if !ok {
		return nil, notFound(dir)
	}
	return ckpt.OpenWith(f, dir, o)
}

// Open opens the checkpoint in the local directory dir, confined to dir:
// nothing outside it (through symlinks or "..") is read. A directory of an
// HF hub cache (source.HubRepo: a snapshot, a directory in one, or a repo
// folder) is confined to its repo folder instead, so that the snapshot's
// links into the repo's blobs/ are followed; a repo folder opens the
// snapshot its refs/main names, as from_pretrained does.
func Open(dir string) (*Checkpoint, error) {
	return OpenAt(context.Background(), dir, "", open.Options{})
}

// OpenAt opens the checkpoint at loc (a local directory or an s3:// URL),
// confined to root (see open.Open); the checkpoint owns the source.
func OpenAt(ctx context.Context, loc, root string, o open.Options) (*Checkpoint, error) {
	return OpenAtWith(ctx, loc, root, o, ckpt.OpenOptions{})
}

// OpenAtWith is OpenAt with what the caller will use of the checkpoint.
func OpenAtWith(ctx context.Context, loc, root string, o open.Options, co ckpt.OpenOptions) (*Checkpoint, error) {
	s, err := open.Open(ctx, loc, root, o)
	if err != nil {
		return nil, fmt.Errorf("layout: %w", err)
	}
	c, err := openSource(s, co)
	if err != nil {
		s.Close()
		return nil, err
	}
	c.Files.Adopt(s)
	return c, nil
}

// openSource opens the checkpoint at s's location with co; the caller
// keeps s open while the checkpoint is used. In a hub cache repo folder it
// opens the snapshot refs/main names, as from_pretrained does.
func openSource(s *open.Source, co ckpt.OpenOptions) (*Checkpoint, error) {
	if s.Hub {
		return openHub(s.Tree, s.Rel)
	}
	dir, err := s.Dir()
	if err != nil {
		return nil, fmt.Errorf("layout: %w", err)
	}
	return OpenAsWith(nil, dir, co)
}

// maxRefSize bounds a hub cache's refs/ file: a commit hash.
const maxRefSize = 256

// openHub opens the checkpoint at rel in the hub cache repo folder tree.
func openHub(tree source.Tree, rel string) (*Checkpoint, error) {
	if rel == "." {
		ref, err := source.ReadFile(tree, "refs/main", maxRefSize)
		if err != nil {
			return nil, fmt.Errorf("layout: %s is an HF hub cache repo folder; open one of its snapshots/ (no refs/main: %w)", tree.Path("."), err)
		}
		commit := strings.TrimSpace(string(ref))
		if !source.IsCommitHash(commit) {
			return nil, fmt.Errorf("layout: %s is not a commit hash", tree.Path("refs/main"))
		}
		rel = "snapshots/" + commit
	}
	sub, err := source.Sub(tree, rel)
	if err != nil {
		return nil, fmt.Errorf("layout: %w", err)
	}
	return OpenTree(sub)
}
