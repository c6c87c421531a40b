package deepspeed

// DeepSpeed's universal checkpoints, as deepspeed.checkpoint.ds_to_universal
// writes them: mp_rank_00_model_states.pt (the engine's model states,
// param_shapes among them) beside zero/<param>/fp32.pt, one torch.save of
// {"param": the whole fp32 parameter, "cat_dim": ...} per trainable
// parameter, and zero/<param>/exp_avg.pt, exp_avg_sq.pt, step.pt (its Adam
// state) and zero/optimizer_state.pt (the param groups). The view is the
// fp32 parameters under param_shapes' names, as zero_to_fp32 makes them
// from the ZeRO checkpoint; every parameter param_shapes names must have
// its fp32.pt with its shape, and no other directory may be there. The
// optimizer files are listed as left out, unread.

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
)

// UniversalDir holds a universal checkpoint's per-parameter directories.
const UniversalDir = "zero"

// fp32File is a parameter's fp32 weights in its directory.
const fp32File = "fp32.pt"

// UniversalReader is the DeepSpeed universal checkpoint format.
var UniversalReader ckpt.Reader = universalReader{}

type universalReader struct{}

func (universalReader) Format() ckpt.Format { return ckpt.FormatDeepSpeedUniversal }

// Detect reports whether dir has model states beside a zero/ directory.
func (universalReader) Detect(dir source.Tree) bool {
	info, err := dir.Stat(UniversalDir)
	return err == nil && info.IsDir() && source.Exists(dir, ModelStates)
}

func (universalReader) Open(dir source.Tree) (*ckpt.Checkpoint, error) { return OpenUniversal(dir) }

// Internal: the model states and zero/, which the view replaces.
func (universalReader) Internal(name string) bool {
	return name == UniversalDir || internalName.MatchString(name)
}

// OpenUniversal opens the universal checkpoint in dir: the model states'
// data.pkl, each fp32.pt's zip directory and data.pkl; no tensor bytes.
func OpenUniversal(dir source.Tree) (*ckpt.Checkpoint, error) {
	c := &ckpt.Checkpoint{Dir: dir.Path("."), Format: ckpt.FormatDeepSpeedUniversal, Files: ckpt.NewFileSet(dir)}
	if err := buildUniversal(c, dir); err != nil {
		c.Close()
		return nil, fmt.Errorf("deepspeed: %w", err)
	}
	return c, nil
}

func buildUniversal(c *ckpt.Checkpoint, dir source.Tree) error {
	msAr, ms, err := open(c, dir, ModelStates)
	if err != nil {
		return err
	}
	groups, err := paramShapes(msAr.File().Path, get(ms, "param_shapes"))
	if err != nil {
		return err
	}
	ents, err := dir.ReadDir(UniversalDir)
	if err != nil {
		return err
	}
	named := map[string]bool{}
	for _, g := range groups {
		for _, p := range g {
			named[p.name] = true
		}
	}
	for _, e := range ents {
		switch {
		case e.Name == "optimizer_state.pt" && e.IsRegular():
			c.Skipped = append(c.Skipped, ckpt.Skipped{Name: path.Join(UniversalDir, e.Name), Reason: "optimizer state (the param groups), never shown as weights"})
		case !e.IsDir() || !named[e.Name]:
			return fmt.Errorf("%w: %s: not a parameter of %s's param_shapes", ckpt.ErrInvalid, dir.Path(path.Join(UniversalDir, e.Name)), msAr.File().Path)
		}
	}
	for _, g := range groups {
		for _, p := range g {
			t, err := universalParam(c, dir, p)
			if err != nil {
				return err
			}
			c.Tensors = append(c.Tensors, t)
		}
	}
	extras(c, ms)
	return nil
}

// universalParam reads zero/<name>/fp32.pt and lists the parameter's
// optimizer state files as left out.
func universalParam(c *ckpt.Checkpoint, dir source.Tree, p param) (*ckpt.Tensor, error) {
	pdir := path.Join(UniversalDir, p.name)
	files, err := dir.ReadDir(pdir)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if f.Name != fp32File && strings.HasSuffix(f.Name, ".pt") {
			c.Skipped = append(c.Skipped, ckpt.Skipped{Name: path.Join(pdir, strings.TrimSuffix(f.Name, ".pt")),
				Reason: "optimizer state (" + path.Join(pdir, f.Name) + "), never shown as weights"})
		}
	}
	if !source.Exists(dir, path.Join(pdir, fp32File)) {
		return nil, fmt.Errorf("%w: %s: missing: param_shapes names %s", ckpt.ErrInvalid, dir.Path(path.Join(pdir, fp32File)), p.name)
	}
	ar, d, err := open(c, dir, path.Join(pdir, fp32File))
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("data.pkl[%q]", "param")
	v, ok := d.Get("param")
	if !ok {
		return nil, fmt.Errorf("%w: %s: no %q", ckpt.ErrInvalid, ar.File().Path, "param")
	}
	t, reason, err := ar.Tensor(v, what)
	if err != nil {
		return nil, err
	}
	if reason != "" {
		return nil, fmt.Errorf("%w: %s: %s: %s", ckpt.ErrInvalid, ar.File().Path, what, reason)
	}
	if !slices.Equal(t.Shape, p.shape) {
		return nil, fmt.Errorf("%w: %s: %s has shape %v, param_shapes says %v", ckpt.ErrInvalid, ar.File().Path, what, t.Shape, p.shape)
	}
	if t.DType != "F32" {
		return nil, fmt.Errorf("%w: %s: %s is %s, not fp32", ckpt.ErrInvalid, ar.File().Path, what, t.DType)
	}
	tn := &ckpt.Tensor{Name: p.name, DType: t.DType, Shape: t.Shape,
		Chunks: ckpt.MakeChunks(ckpt.Chunk{Offsets: make([]int64, len(t.Shape)), Sizes: t.Shape, Source: t.Source(p.name, 0, t.Size)})}
	if err := tn.Validate(); err != nil {
		return nil, err
	}
	return tn, nil
}
