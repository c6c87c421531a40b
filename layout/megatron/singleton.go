package megatron

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// With singleton local shards (content_metadata "singleton_local_shards",
// megatron-core's option for checkpoints resharded by DP), Megatron-Core
// saves one key per layer (decoder.layers.<i>.<rest>) and per expert
// (mlp.experts.experts.<e>.<rest>) instead of stacking them on leading
// axes, and each SwiGLU linear_fc1 as <key>_w (gate) and <key>_v (up)
// instead of one [gate; up] tensor. stackSingletons puts such a checkpoint
// back into the global tensors the default save makes, as chunks of the
// same bytes, so that one mapping (and one view) serves both.

// singletonIndex finds a layer or expert index in a key: the number after
// "decoder.layers." or after "experts.experts.".
var singletonIndex = regexp.MustCompile(`(^decoder\.layers|\.experts\.experts)\.(0|[1-9][0-9]{0,5})\.`)

// swigluPart is the _w (gate) or _v (up) half of a linear_fc1 key.
var swigluPart = regexp.MustCompile(`^(.*\.linear_fc1\.(?:weight|bias))_([wv])$`)

// stackSingletons rewrites c's model tensors (not the optimizer's) saved as
// singleton local shards into stacked ones. Every layer (and expert) of a
// stacked tensor must be there, with one dtype and shape; else it is an
// error naming the key.
func stackSingletons(c *ckpt.Checkpoint) error {
	type member struct {
		t   *ckpt.Tensor
		idx []int64 // layer, then expert
	}
	groups := map[string][]member{}
	var out []*ckpt.Tensor
	var order []string // stacked names, placed where their first member was
	for _, t := range c.Tensors {
		if strings.HasPrefix(t.Name, optimizerPrefix) {
			out = append(out, t)
			continue
		}
		name, idx := t.Name, []int64(nil)
		for {
			m := singletonIndex.FindStringSubmatchIndex(name)
			if m == nil {
				break
			}
			i, _ := strconv.ParseInt(name[m[4]:m[5]], 10, 64)
			idx = append(idx, i)
			name = name[:m[3]] + name[m[5]:]
		}
		if idx == nil {
			out = append(out, t)
			continue
		}
		if _, seen := groups[name]; !seen {
			order = append(order, name)
			out = append(out, nil) // a placeholder for the stacked tensor
		}
		groups[name] = append(groups[name], member{t, idx})
	}
	stacked := map[string]*ckpt.Tensor{}
	for _, name := range order {
		ms := groups[name]
		first := ms[0].t
		counts := make([]int64, len(ms[0].idx))
		for _, m := range ms {
			if len(m.idx) != len(counts) || m.t.DType != first.DType || !slices.Equal(m.t.Shape, first.Shape) {
				return fmt.Errorf("megatron: %s: %s and %s cannot be stacked as one tensor", c.Dir, first.Name, m.t.Name)
			}
			for k, i := range m.idx {
				counts[k] = max(counts[k], i+1)
			}
		}
		n := int64(1)
		for _, k := range counts {
			n *= k // each at most 10^6, at most two: no overflow
		}
		if n != int64(len(ms)) {
			return fmt.Errorf("megatron: %s: %s: %d keys do not fill %v layers×experts (one is missing)", c.Dir, name, len(ms), counts)
		}
		t := &ckpt.Tensor{Name: name, Path: []string{name}, DType: first.DType, Shape: append(slices.Clone(counts), first.Shape...)}
		for _, m := range ms {
			for _, ch := range m.t.Chunks.All() {
				t.Chunks.Append(ckpt.Chunk{
					Offsets: append(slices.Clone(m.idx), ch.Offsets...),
					Sizes:   append(slices.Repeat([]int64{1}, len(m.idx)), ch.Sizes...),
					Source:  ch.Source,
				})
			}
		}
		stacked[name] = t
	}
	i := 0
	for j, t := range out {
		if t == nil {
			out[j] = stacked[order[i]]
			i++
		}
	}
	fused, err := fuseSwiGLU(c.Dir, out)
	if err != nil {
		return err
	}
	for _, t := range fused {
		if err := t.Validate(); err != nil {
			return fmt.Errorf("megatron: %s: %w", c.Dir, err)
		}
	}
	c.Tensors = fused
	return nil
}

// fuseSwiGLU joins each linear_fc1 key's _w and _v tensors into the one
// [gate; up] tensor (along the first axis after the stacked ones: the rows)
// that the default save makes.
func fuseSwiGLU(dir string, ts []*ckpt.Tensor) ([]*ckpt.Tensor, error) {
	halves := map[string][2]*ckpt.Tensor{}
	var out []*ckpt.Tensor
	for _, t := range ts {
		m := swigluPart.FindStringSubmatch(t.Name)
		if m == nil || strings.HasPrefix(t.Name, optimizerPrefix) {
			out = append(out, t)
			continue
		}
		h, seen := halves[m[1]]
		if !seen {
			out = append(out, &ckpt.Tensor{Name: m[1]}) // filled below
		}
		h[map[string]int{"w": 0, "v": 1}[m[2]]] = t
		halves[m[1]] = h
	}
	for _, t := range out {
		h, ok := halves[t.Name]
		if !ok {
			continue
		}
		w, v := h[0], h[1]
		if w == nil || v == nil {
			return nil, fmt.Errorf("megatron: %s: %s has only one of its _w and _v halves", dir, t.Name)
		}
		if w.DType != v.DType || !slices.Equal(w.Shape, v.Shape) {
			return nil, fmt.Errorf("megatron: %s: %s_w and %s_v differ in type or shape", dir, t.Name, t.Name)
		}
		axis := len(w.Shape) - 2 // the rows: a weight is [.., rows, cols]
		if strings.HasSuffix(t.Name, ".bias") {
			axis = len(w.Shape) - 1
		}
		if axis < 0 {
			return nil, fmt.Errorf("megatron: %s: %s_w has shape %v", dir, t.Name, w.Shape)
		}
		t.Path, t.DType, t.Shape = []string{t.Name}, w.DType, slices.Clone(w.Shape)
		t.Shape[axis] *= 2
		for half, src := range []*ckpt.Tensor{w, v} {
			for _, ch := range src.Chunks.All() {
				off := slices.Clone(ch.Offsets)
				off[axis] += int64(half) * w.Shape[axis]
				t.Chunks.Append(ckpt.Chunk{Offsets: off, Sizes: ch.Sizes, Source: ch.Source})
			}
		}
	}
	return out, nil
}
