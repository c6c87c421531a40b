// Package trainer reads the checkpoint-N/ folders transformers' Trainer
// writes with FSDP (fsdp.go) and with DeepSpeed (and DeepSpeed's own
// save_checkpoint directory), here:
// a `latest` file naming the tag directory (global_stepN/) that holds the
// ZeRO checkpoint, beside the model's config.json and Trainer's state. The
// folder's view is the view of the checkpoint `latest` names, with the
// folder's own sidecars (config.json, tokenizer files), so the folder users
// point at loads as the model. The tag must be a directory of the folder:
// a `latest` naming anything else (a path, "..", a link out) is refused.
package trainer

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/deepspeed"
	"github.com/ckptfs/ckptfs/layout/source"
)

// LatestFile names the checkpoint tag DeepSpeed saved last.
const LatestFile = "latest"

// maxLatest bounds the latest file: a tag.
const maxLatest = 256

// Reader is a folder whose `latest` names its DeepSpeed checkpoint.
var Reader ckpt.Reader = reader{}

type reader struct{}

func (reader) Format() ckpt.Format { return ckpt.FormatTrainerDeepSpeed }

// Detect reports whether dir's `latest` names a tag directory that is a
// DeepSpeed checkpoint, or names anything else (a path outside, a link
// out, a missing directory) while a directory of dir is one: then Open
// refuses it in a line rather than the folder passing through.
func (reader) Detect(dir source.Tree) bool {
	b, err := source.ReadFile(dir, LatestFile, maxLatest)
	if err != nil {
		return false
	}
	if tag, err := parseTag(dir, b); err == nil {
		if sub, err := source.Sub(dir, tag); err == nil && deepspeed.Reader.Detect(sub) {
			return true
		}
	}
	ents, err := dir.ReadDir(".")
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.IsDir() {
			if sub, err := source.Sub(dir, e.Name); err == nil && deepspeed.Reader.Detect(sub) {
				return true
			}
		}
	}
	return false
}

func (reader) Open(dir source.Tree) (*ckpt.Checkpoint, error) { return OpenTree(dir) }

// Internal: nothing; the tag directory, `latest` and Trainer's files show
// through beside the view (the tag directory is a view of its own).
func (reader) Internal(string) bool { return false }

// readTag reads `latest`: one directory name of dir.
func readTag(dir source.Tree) (string, error) {
	b, err := source.ReadFile(dir, LatestFile, maxLatest)
	if err != nil {
		return "", err
	}
	return parseTag(dir, b)
}

// parseTag checks the tag b of dir's `latest`: one name, no path.
func parseTag(dir source.Tree, b []byte) (string, error) {
	tag := strings.TrimSpace(string(b))
	if tag == "" || tag == "." || tag == ".." || strings.ContainsAny(tag, "/\\\x00\n") {
		return "", fmt.Errorf("%w: trainer: %s names %q, not a directory of %s", ckpt.ErrInvalid, dir.Path(LatestFile), tag, dir.Path("."))
	}
	return tag, nil
}

// OpenTree opens the DeepSpeed checkpoint dir's `latest` names, as dir's
// checkpoint.
func OpenTree(dir source.Tree) (*ckpt.Checkpoint, error) {
	tag, err := readTag(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: trainer: %s: no %s", ckpt.ErrInvalid, dir.Path("."), LatestFile)
		}
		return nil, err
	}
	info, err := dir.Stat(tag)
	if err != nil || !info.IsDir() {
		return nil, fmt.Errorf("%w: trainer: %s names %q, which is not a directory of %s (%v)", ckpt.ErrInvalid,
			dir.Path(LatestFile), tag, dir.Path("."), statWhy(info, err))
	}
	sub, err := source.Sub(dir, tag)
	if err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	inner, err := deepspeed.OpenTree(sub)
	if err != nil {
		return nil, err
	}
	return wrap(dir, ckpt.FormatTrainerDeepSpeed, inner), nil
}

// statWhy says why a tag is no directory.
func statWhy(info source.Info, err error) string {
	if err != nil {
		return err.Error()
	}
	if info.IsBrokenLink() {
		return "a link that dangles or leads out of the source"
	}
	return "a " + info.Mode.Type().String() + " entry"
}
