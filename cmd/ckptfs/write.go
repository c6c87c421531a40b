package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/dcpwrite"
)

// writeFlags choose whether a mount is writable and the layout written.
type writeFlags struct {
	rw        bool
	worldSize int
	plan      string
	like      string
	prefix    string
}

func (w *writeFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&w.rw, "rw", false, "writable mount: directories created in it become DCP checkpoints of the safetensors written into them")
	fs.IntVar(&w.worldSize, "world-size", 1, "with --rw: `N` ranks in the written checkpoint; tensors are sharded on dim 0 as FSDP2 does unless --plan or --like says otherwise")
	fs.StringVar(&w.plan, "plan", "", "with --rw: per-tensor placement `FILE`, one \"REGEX DIM\" or \"REGEX replicate\" per line, first match wins (e.g. 'q_proj 0', 'o_proj 1', 'norm replicate')")
	fs.StringVar(&w.like, "like", "", "with --rw: reuse the chunk layout of the checkpoint in `DIR` for the tensors it has")
	fs.StringVar(&w.prefix, "prefix", "", "with --rw: store tensors under `KEY` (e.g. model, as dcp.save of {\"model\": state_dict} does)")
}

// target builds the write layout, checking the flags.
func (w *writeFlags) target() (dcpwrite.Target, error) {
	t := dcpwrite.Target{WorldSize: w.worldSize, Prefix: strings.Trim(w.prefix, ".")}
	if !w.rw {
		if w.worldSize != 1 || w.plan != "" || w.like != "" || w.prefix != "" {
			return t, errors.New("--world-size, --plan, --like and --prefix need --rw")
		}
		return t, nil
	}
	if w.worldSize < 1 {
		return t, fmt.Errorf("--world-size %d: want 1 or more", w.worldSize)
	}
	if w.plan != "" {
		f, err := os.Open(w.plan)
		if err != nil {
			return t, err
		}
		defer f.Close()
		if t.Rules, err = dcpwrite.ParseRules(f); err != nil {
			return t, fmt.Errorf("--plan %s: %w", w.plan, err)
		}
	}
	if w.like != "" {
		c, err := layout.Open(w.like)
		if err != nil {
			return t, fmt.Errorf("--like: %w", err)
		}
		c.Close() // only the chunk boxes are used
		t.Like = c
	}
	return t, nil
}

func (w *writeFlags) describe() string {
	if !w.rw {
		return "read-only"
	}
	s := fmt.Sprintf("read-write: new directories become DCP checkpoints, world size %d", w.worldSize)
	if w.plan != "" {
		s += ", plan " + w.plan
	}
	if w.like != "" {
		s += ", like " + w.like
	}
	if w.prefix != "" {
		s += ", prefix " + w.prefix
	}
	return s
}
