package trainer

// Trainer's checkpoint-N/ with FSDP (accelerate's SHARDED_STATE_DICT):
// pytorch_model_fsdp_0/ is the model, a torch DCP of {"model": state
// dict} (accelerate's save_fsdp_model), beside optimizer_0/ (a DCP of the
// optimizer's state), Trainer's state files and the model's config.json.
// The folder's view is the view of pytorch_model_fsdp_0/, with the
// folder's own sidecars, so the folder users point at loads as the model;
// pytorch_model_fsdp_0/ is still a view of its own.

import (
	"fmt"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
)

// FSDPModelDir is where accelerate saves the sharded model of a Trainer
// checkpoint (FSDP_MODEL_NAME, model index 0).
const FSDPModelDir = "pytorch_model_fsdp_0"

// FSDPReader is a Trainer checkpoint-N/ folder saved with FSDP.
var FSDPReader ckpt.Reader = fsdpReader{}

type fsdpReader struct{}

func (fsdpReader) Format() ckpt.Format { return ckpt.FormatTrainerFSDP }

// Detect reports whether dir has an entry pytorch_model_fsdp_0 (a file
// or a link out by that name too: Open then refuses it in a line rather
// than the folder passing through). A folder of several models
// (pytorch_model_fsdp_1/) is read as its first, Trainer's.
func (fsdpReader) Detect(dir source.Tree) bool { return source.Exists(dir, FSDPModelDir) }

func (fsdpReader) Open(dir source.Tree) (*ckpt.Checkpoint, error) {
	return OpenFSDP(dir, ckpt.OpenOptions{})
}

// OpenWith leaves optimizer state out as the DCP reader does.
func (fsdpReader) OpenWith(dir source.Tree, o ckpt.OpenOptions) (*ckpt.Checkpoint, error) {
	return OpenFSDP(dir, o)
}

// Internal: nothing; pytorch_model_fsdp_0/, optimizer_0/ and Trainer's
// files show through beside the view (the model directory is a view of
// its own).
func (fsdpReader) Internal(string) bool { return false }

// OpenFSDP opens dir's pytorch_model_fsdp_0/ as dir's checkpoint.
func OpenFSDP(dir source.Tree, o ckpt.OpenOptions) (*ckpt.Checkpoint, error) {
	info, err := dir.Stat(FSDPModelDir)
	if err != nil || !info.IsDir() {
		return nil, fmt.Errorf("%w: trainer: %s is not a directory of %s (%v)", ckpt.ErrInvalid,
			dir.Path(FSDPModelDir), dir.Path("."), statWhy(info, err))
	}
	sub, err := source.Sub(dir, FSDPModelDir)
	if err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	if !torchdcp.Detect(sub) {
		return nil, fmt.Errorf("%w: trainer: %s holds no %s: not the sharded model accelerate saves", ckpt.ErrInvalid,
			sub.Path("."), torchdcp.MetadataFile)
	}
	inner, err := ckpt.OpenWith(torchdcp.Reader, sub, o)
	if err != nil {
		return nil, err
	}
	return wrap(dir, ckpt.FormatTrainerFSDP, inner), nil
}

// wrap is inner, the checkpoint of a directory of dir, as dir's: its
// tensors with dir's files for sidecars.
func wrap(dir source.Tree, format ckpt.Format, inner *ckpt.Checkpoint) *ckpt.Checkpoint {
	return &ckpt.Checkpoint{
		Dir: dir.Path("."), Format: format, Files: ckpt.NewFileSet(dir),
		Tensors: inner.Tensors, Left: inner.Left, Objects: inner.Objects, Skipped: inner.Skipped, FileIndex: inner.FileIndex,
		ModTime: inner.ModTime, Record: inner.Record, Warnings: inner.Warnings, HFConfig: inner.HFConfig,
		Parts: []*ckpt.Checkpoint{inner},
	}
}
