package mapping

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// Spec is a mapping as data: the built-in ones (one table per model family)
// and a user's --map file have this one form.
//
//	{"name": "my-model",
//	 "params": {"heads": 8},
//	 "tensors": [
//	   {"to": "model.layers.{l}.self_attn.q_proj.weight",
//	    "from": "blocks.{l}.attn.qkv.weight",
//	    "split": {"sizes": ["heads*head_dim", "kv_heads*head_dim", "kv_heads*head_dim"], "take": 0}},
//	   ...]}
type Spec struct {
	Name string `json:"name"`
	// Params fixes hyper-parameters; config.json and the checkpoint's own
	// arguments give the others.
	Params map[string]int64 `json:"params,omitempty"`
	// MoE names the HF mixture-of-experts family the rules make
	// (ckpt.MoEMixtral, ckpt.MoEQwen), for the config.json a view
	// generates; "" for a dense model.
	MoE string `json:"moe,omitempty"`
	// Model names the HF model the rules make when the checkpoint's
	// arguments do not decide it (ckpt.ModelLlama); "" otherwise.
	Model string `json:"model,omitempty"`
	Rules []Rule `json:"tensors"`
}

// Rule makes one view tensor, or one per layer when To holds "{l}".
type Rule struct {
	// To is the view name; "{l}" is the layer index.
	To string `json:"to"`
	// From are the source names to try, in order (a string or a list);
	// "{l}" matches a layer index in the name.
	From Names `json:"from"`
	// Stacked says the source holds every layer (or expert) on leading
	// axes, as Megatron saves them: ["l"] (or true) takes layer l from
	// index l of dimension 0; ["l", "e"] layer l of dimension 0 and expert
	// e of dimension 1; ["e"] expert e of dimension 0 (torchtitan's
	// grouped experts of one layer).
	Stacked Axes `json:"stacked,omitempty"`
	// Rows keeps rows "start:end" of dimension 0 (after taking the layer):
	// an unpadded vocabulary, say ("0:vocab").
	Rows string `json:"rows,omitempty"`
	// Split takes one part of a fused tensor.
	Split *Split `json:"split,omitempty"`
	// Permute reorders the rows.
	Permute *Permute `json:"permute,omitempty"`
	// Optional rules are skipped when no source exists (a bias, a norm
	// only some models have).
	Optional bool `json:"optional,omitempty"`
	// UnlessTied rules are skipped when the model ties its output
	// projection to its input embeddings (the source is left out, as
	// save_pretrained leaves it out).
	UnlessTied bool `json:"unless_tied,omitempty"`
}

// Split cuts dimension 0 into Groups equal groups, each made of parts of the
// given sizes (in rows), and takes part Take of every group: Q, K or V of a
// QKV tensor interleaved per query group, gate or up of a fused MLP.
type Split struct {
	Groups string   `json:"groups,omitempty"` // default "1"
	Sizes  []string `json:"sizes"`
	Take   int      `json:"take"`
}

// Permute reorders rows. Rope: the rows are Rope heads, each stored in
// interleaved-pair RoPE order (x0, y0, x1, y1, ...), and are shown in the
// rotate-half order HF Llama uses (x0, x1, ..., y0, y1, ...).
type Permute struct {
	Rope string `json:"rope"`
}

// Axes names the index each leading axis of a stacked source holds.
type Axes []string

// ByLayer is a source stacked by layer on dimension 0.
var ByLayer = Axes{"l"}

// UnmarshalJSON accepts true (layers on dimension 0), false, or a list of
// index names.
func (a *Axes) UnmarshalJSON(b []byte) error {
	var flag bool
	if err := json.Unmarshal(b, &flag); err == nil {
		*a = nil
		if flag {
			*a = ByLayer
		}
		return nil
	}
	var names []string
	if err := json.Unmarshal(b, &names); err != nil {
		return fmt.Errorf(`stacked: want true or a list of "l" and "e"`)
	}
	*a = names
	return nil
}

// Names is one name or a list of alternatives.
type Names []string

// UnmarshalJSON accepts "name" or ["name", ...].
func (n *Names) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*n = Names{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("from: want a name or a list of names")
	}
	*n = many
	return nil
}

// maxSpecBytes bounds a --map file.
const maxSpecBytes = 1 << 20

// ReadFile reads and parses the --map file at path. It reads at most
// maxSpecBytes+1 bytes of a regular file, so that a huge file, /dev/zero
// or a FIFO fails at once instead of filling memory or never ending.
func ReadFile(path string) (*Spec, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("mapping: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("mapping: %s: not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSpecBytes+1))
	if err != nil {
		return nil, fmt.Errorf("mapping: %w", err)
	}
	s, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Parse reads a --map file. Unknown fields are errors, so a typo is not a
// silently ignored rule.
func Parse(data []byte) (*Spec, error) {
	if len(data) > maxSpecBytes {
		return nil, fmt.Errorf("mapping: larger than %d bytes", maxSpecBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var s Spec
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("mapping: %w", err)
	}
	if err := s.validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// validate checks what can be checked without a checkpoint.
func (s *Spec) validate() error {
	if s.Name == "" {
		return fmt.Errorf("mapping: no name")
	}
	if len(s.Rules) == 0 {
		return fmt.Errorf("mapping %s: no tensors", s.Name)
	}
	if s.MoE != "" && s.MoE != ckpt.MoEMixtral && s.MoE != ckpt.MoEQwen {
		return fmt.Errorf("mapping %s: moe %q is not %q or %q", s.Name, s.MoE, ckpt.MoEMixtral, ckpt.MoEQwen)
	}
	if s.Model != "" && s.Model != ckpt.ModelLlama {
		return fmt.Errorf("mapping %s: model %q is not %q", s.Name, s.Model, ckpt.ModelLlama)
	}
	for i, r := range s.Rules {
		where := fmt.Sprintf("mapping %s: tensor %d (%q)", s.Name, i, r.To)
		switch {
		case r.To == "":
			return fmt.Errorf("%s: no \"to\"", where)
		case len(r.From) == 0:
			return fmt.Errorf("%s: no \"from\"", where)
		case len(r.Stacked) > numIndices:
			return fmt.Errorf("%s: stacked on %d axes", where, len(r.Stacked))
		case r.Split != nil && (len(r.Split.Sizes) == 0 || r.Split.Take < 0 || r.Split.Take >= len(r.Split.Sizes)):
			return fmt.Errorf("%s: split takes part %d of %d", where, r.Split.Take, len(r.Split.Sizes))
		case r.Permute != nil && r.Permute.Rope == "":
			return fmt.Errorf("%s: permute needs \"rope\": the number of heads", where)
		}
		if err := r.validateIndices(); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if r.Rows != "" {
			if _, _, ok := strings.Cut(r.Rows, ":"); !ok {
				return fmt.Errorf("%s: rows %q is not \"start:end\"", where, r.Rows)
			}
		}
	}
	return nil
}

// validateIndices checks that each index the view name uses comes, for
// every source name, from a stacked axis or from the name itself (which
// then wins: one rule covers Megatron's experts stacked on an axis and the
// same experts saved one per name), and that every index a source gives is
// used by the view name.
func (r *Rule) validateIndices() error {
	seen := map[string]bool{}
	for _, ax := range r.Stacked {
		if indexOf(ax) < 0 || seen[ax] {
			return fmt.Errorf("stacked %q: want each of \"l\" and \"e\" at most once", []string(r.Stacked))
		}
		seen[ax] = true
	}
	for i, name := range indexNames {
		ph := placeholder(i)
		inTo := strings.Contains(r.To, ph)
		if seen[name] && !inTo {
			return fmt.Errorf("a source stacked by %q needs %q in \"to\"", name, ph)
		}
		for _, from := range r.From {
			if inTo != (seen[name] || strings.Contains(from, ph)) {
				return fmt.Errorf("%q in \"to\" needs a source stacked by %q or %q in \"from\" %q, and the other way round", ph, name, ph, from)
			}
		}
	}
	return nil
}
