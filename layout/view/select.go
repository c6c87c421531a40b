package view

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// Which tensors a view shows, and under which names, comes from what the
// checkpoint says, never from the look of a name:
//
//   - A tensor's saved nesting (Tensor.Path: DCP planner_data, or what a
//     format's writer is known to do) tells whether the state was saved as
//     {"model": ..., "optimizer": ...}. Only then is a subtree picked by
//     default: the first of modelRoots saved, shown without its prefix.
//   - Flat names (HF-sharded, plain safetensors, flat DCP) are shown as
//     saved: "model.embed_tokens.weight" stays that, and "lm_head.weight"
//     is shown beside it.
//   - Optimizer state (a saved subtree under "optimizer", "optim",
//     "optimizer_states", "optimizer_0", ..., at any level) is never shown
//     as weights.
//   - Every tensor left out is listed with the reason (View.Omitted).

// modelRoots are the subtrees a model is saved under in a nested state, in
// the order they are looked for: {"model", "optimizer"} (DCP, torch
// tutorials), Lightning's "state_dict", "model_state_dict", DeepSpeed's
// "module", Composer's state.model.
var modelRoots = []string{"model", "state_dict", "model_state_dict", "module", "state.model"}

// named is a tensor with the name it has in the view.
type named struct {
	name   string
	tensor *ckpt.Tensor
}

// savedRoot returns the top-level key a tensor was saved under, when its
// saved nesting is known and has more than one level.
func savedRoot(t *ckpt.Tensor) (string, bool) {
	if len(t.Path) >= 2 {
		return t.Path[0], true
	}
	return "", false
}

func isOptimizerState(t *ckpt.Tensor) bool { return ckpt.IsOptimizerPath(t.Path) }

// OpenOptions is what a checkpoint planned with o needs opened: without
// optimizer state unless o may show it, or checks every chunk (Verify).
func OpenOptions(o Options) ckpt.OpenOptions {
	return ckpt.OpenOptions{LeaveOptimizer: !NeedsOptimizer(o.Select) && !o.Verify}
}

// NeedsOptimizer reports whether a view of Select sel may show optimizer
// state, so that its checkpoint must be opened with it
// (ckpt.OpenOptions.LeaveOptimizer false).
func NeedsOptimizer(sel string) bool {
	return sel == SelectAll || slices.ContainsFunc(strings.Split(sel, "."), ckpt.IsOptimizerKey)
}

// modelRoot returns the subtree of modelRoots some tensor of c was saved
// nested under, or "".
func modelRoot(c *ckpt.Checkpoint) string {
	for _, root := range modelRoots {
		for _, t := range c.Tensors {
			if _, ok := under(t, root); ok && len(t.Path) >= 2 {
				return root
			}
		}
	}
	return ""
}

// selectTensors picks the tensors of the view and their view names, and
// lists the others with the reason.
func selectTensors(c *ckpt.Checkpoint, sel string) ([]named, []Omission, error) {
	auto := sel == ""
	root := ""
	if auto {
		root = modelRoot(c)
		sel = root
	}
	var out []named
	var omitted []Omission
	seen := map[string]bool{}
	for _, t := range c.Tensors {
		name, reason := t.Name, ""
		switch {
		case sel == SelectAll:
		case sel == "":
			if isOptimizerState(t) {
				reason = "optimizer state"
			}
		default:
			rest, ok := under(t, sel)
			switch {
			case ok:
				name = rest
			case isOptimizerState(t):
				reason = "optimizer state"
			case auto:
				top, _ := savedRoot(t)
				reason = fmt.Sprintf("saved outside the %q subtree (under %q)", root, top)
				if top == "" {
					reason = fmt.Sprintf("saved outside the %q subtree (at the top level)", root)
				}
			default:
				reason = fmt.Sprintf("not under --select %q", sel)
			}
		}
		if reason != "" {
			omitted = append(omitted, Omission{Name: t.Name, Reason: reason, Optimizer: reason == "optimizer state"})
			continue
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("layout: %s: two tensors map to view name %q", c.Dir, name)
		}
		seen[name] = true
		out = append(out, named{name, t})
	}
	if len(c.Left) > 0 && NeedsOptimizer(sel) {
		return nil, nil, fmt.Errorf("layout: %s: opened without its optimizer state, which --select %q may show", c.Dir, sel)
	}
	for _, t := range c.Left {
		omitted = append(omitted, Omission{Name: t.Name, Reason: "optimizer state", Optimizer: true})
	}
	return out, omitted, nil
}

// under reports whether t lies in the subtree sel and returns its name
// relative to sel. A tensor whose saved nesting is known is matched against
// whole nesting levels, and within its last level (a module's flat
// state-dict key, as Composer's state.model holds "model.lm_head.weight")
// against its dotted prefix; a flat name, against its dotted prefix (the
// user asked for that prefix by name).
func under(t *ckpt.Tensor, sel string) (string, bool) {
	if len(t.Path) <= 1 {
		rest, ok := strings.CutPrefix(t.Name, sel+".")
		return rest, ok && rest != ""
	}
	prefix := ""
	for i, part := range t.Path[:len(t.Path)-1] {
		if i > 0 {
			prefix += "."
		}
		prefix += part
		if prefix == sel {
			return strings.Join(t.Path[i+1:], "."), true
		}
		if !strings.HasPrefix(sel, prefix+".") {
			return "", false
		}
	}
	rest, ok := strings.CutPrefix(t.Path[len(t.Path)-1], strings.TrimPrefix(sel, prefix+".")+".")
	return rest, ok && rest != ""
}
