// Package stages reads a training step saved by pipeline stages as sibling
// DCP checkpoints: KempnerForge writes step_N/pp0/, step_N/pp1/, ... each a
// complete DCP checkpoint of one stage's disjoint part of the state (saved
// on that stage's process group). The step directory is one model: the
// stages' tensors together. Stages must be numbered from 0 without gaps and
// no tensor may be in two stages; anything else is an error, never a
// partial model. (A missing last stage cannot be told from the files.)
package stages

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
)

// stageName has no leading zeros, so that one stage has one name.
var stageName = regexp.MustCompile(`^pp(0|[1-9]\d{0,5})$`)

// Reader is the pipeline-stages layout.
var Reader ckpt.Reader = reader{}

type reader struct{}

func (reader) Format() ckpt.Format { return ckpt.FormatStages }

// Detect reports whether dir has a stage directory (pp0/, pp1/, ...) that
// is a DCP checkpoint: any stage, so that a missing pp0/ is reported by Open
// rather than hiding the others.
func (reader) Detect(dir source.Tree) bool {
	ents, err := dir.ReadDir(".")
	if err != nil {
		return false
	}
	for _, e := range ents {
		if stageName.MatchString(e.Name) && e.IsDir() {
			if sub, err := source.Sub(dir, e.Name); err == nil && torchdcp.Detect(sub) {
				return true
			}
		}
	}
	return false
}

func (reader) Internal(name string) bool { return IsInternal(name) }

func (reader) Open(dir source.Tree) (*ckpt.Checkpoint, error) { return OpenTree(dir) }

// IsInternal reports whether name is a stage directory.
func IsInternal(name string) bool { return stageName.MatchString(name) }

// OpenTree opens every stage of dir and merges them.
func OpenTree(dir source.Tree) (*ckpt.Checkpoint, error) {
	names, err := stageDirs(dir)
	if err != nil {
		return nil, err
	}
	c := &ckpt.Checkpoint{Dir: dir.Path("."), Format: ckpt.FormatStages, Files: ckpt.NewFileSet(dir)}
	owner := map[string]string{}
	for _, name := range names {
		sub, err := source.Sub(dir, name)
		if err == nil {
			var part *ckpt.Checkpoint
			part, err = torchdcp.OpenTree(sub, torchdcp.Options{})
			if err == nil {
				c.Parts = append(c.Parts, part)
				err = merge(c, part, name, owner)
			}
		}
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("stages: %w", err)
		}
	}
	return c, nil
}

// stageDirs lists pp0, pp1, ... in order and checks there is no gap.
func stageDirs(dir source.Tree) ([]string, error) {
	ents, err := dir.ReadDir(".")
	if err != nil {
		return nil, fmt.Errorf("stages: %w", err)
	}
	var idx []int
	for _, e := range ents {
		m := stageName.FindStringSubmatch(e.Name)
		if m == nil {
			continue
		}
		// A stage name that is not a directory is a stage that cannot be
		// read: serving the others would be a shorter model.
		if !e.IsDir() {
			return nil, fmt.Errorf("stages: %s: pipeline stage %s is %s, not a directory",
				dir.Path("."), e.Name, kind(e))
		}
		n, _ := strconv.Atoi(m[1])
		idx = append(idx, n)
	}
	sort.Ints(idx)
	names := make([]string, len(idx))
	for i, n := range idx {
		if n != i {
			return nil, fmt.Errorf("stages: %s: pipeline stage pp%d is missing (found %s)",
				dir.Path("."), i, strings.Join(stageList(idx), ", "))
		}
		names[i] = "pp" + strconv.Itoa(n)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("stages: %s: no pp0/ stage directory", dir.Path("."))
	}
	return names, nil
}

// kind names what a directory entry is, for messages.
func kind(e source.Info) string {
	switch {
	case e.IsBrokenLink():
		return "a link that dangles or leads out of the source"
	case e.IsRegular():
		return "a regular file"
	}
	return "a " + e.Mode.Type().String() + " entry"
}

func stageList(idx []int) []string {
	out := make([]string, len(idx))
	for i, n := range idx {
		out[i] = "pp" + strconv.Itoa(n)
	}
	return out
}

// merge adds a stage's tensors and items to c. Tensor names must be
// disjoint across stages; non-tensor items (each stage's param_groups, say)
// may repeat and are named with their stage.
func merge(c, part *ckpt.Checkpoint, stage string, owner map[string]string) error {
	for _, t := range part.Tensors {
		if prev, dup := owner[t.Name]; dup {
			return fmt.Errorf("%s: tensor %q is saved by both %s and %s", c.Dir, t.Name, prev, stage)
		}
		owner[t.Name] = stage
		c.Tensors = append(c.Tensors, t)
	}
	for _, o := range part.Objects {
		o.Source = stage + "/" + o.Source
		c.Objects = append(c.Objects, o)
	}
	for _, s := range part.Skipped {
		s.Reason = stage + ": " + s.Reason
		c.Skipped = append(c.Skipped, s)
	}
	return nil
}
