package view

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
)

// openWith opens a fixture checkpoint with o.
func openWith(t *testing.T, dir string, o ckpt.OpenOptions) *ckpt.Checkpoint {
	tree, err := source.OpenLocal(dir)
	require.NoError(t, err)
	c, err := layout.OpenAsWith(nil, tree, o)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(); tree.Close() })
	return c
}

// A checkpoint opened without its optimizer state (what a mount and
// inspect do unless --select may show it) has the same view and the same
// report as one opened whole: the optimizer tensors are listed, described
// and left out with the same reason; only their chunks are not kept.
func TestLeftOptimizerSameView(t *testing.T) {
	dirs, err := filepath.Glob("../../testdata/*/ckpt/.metadata")
	require.NoError(t, err)
	sawLeft := false
	for _, m := range dirs {
		dir := filepath.Dir(m)
		t.Run(dir, func(t *testing.T) {
			whole := openWith(t, dir, ckpt.OpenOptions{})
			left := openWith(t, dir, OpenOptions(Options{}))
			var wantLeft []string
			for _, tn := range whole.Tensors {
				if ckpt.IsOptimizerPath(tn.Path) {
					wantLeft = append(wantLeft, tn.Name)
				}
			}
			var gotLeft []string
			for _, l := range left.Left {
				gotLeft = append(gotLeft, l.Name)
			}
			assert.Equal(t, wantLeft, gotLeft)
			assert.Equal(t, len(whole.Tensors), len(left.Tensors)+len(left.Left))
			sawLeft = sawLeft || len(gotLeft) > 0

			vw, errW := Plan(whole, Options{})
			vl, errL := Plan(left, Options{})
			require.Equal(t, errW == nil, errL == nil, "%v / %v", errW, errL)
			if errW != nil {
				return
			}
			rw, rl := NewReport(whole, vw), NewReport(left, vl)
			byName := func(a, b TensorReport) int {
				if a.Name < b.Name {
					return -1
				}
				if a.Name > b.Name {
					return 1
				}
				return 0
			}
			slices.SortFunc(rw.Tensors, byName)
			slices.SortFunc(rl.Tensors, byName)
			assert.Equal(t, rw.Tensors, rl.Tensors)
			om := func(a, b Omission) int { return byName(TensorReport{Name: a.Name}, TensorReport{Name: b.Name}) }
			slices.SortFunc(rw.Omitted, om)
			slices.SortFunc(rl.Omitted, om)
			assert.Equal(t, rw.Omitted, rl.Omitted)
			assert.Equal(t, rw.Files, rl.Files)
			assert.Equal(t, rw.View, rl.View)
			assert.Equal(t, rw.Note, rl.Note)

			// A selection that may show optimizer state needs it opened.
			if len(left.Left) > 0 {
				_, err := Plan(left, Options{Select: SelectAll})
				assert.ErrorContains(t, err, "opened without its optimizer state")
			}
		})
	}
	assert.True(t, sawLeft, "no fixture has optimizer state: the test checks nothing")
}

func TestNeedsOptimizer(t *testing.T) {
	// An optimizer key at any level: Composer's state.optimizers, a
	// Lightning optimizer_0.
	for sel, want := range map[string]bool{"": false, "model": false, ".": true, "optim": true,
		"optimizer.state": true, "opt.x": true, "model.optim": true, "state.model": false,
		"state.optimizers": true, "optimizer_0": true, "optimizer_x": false} {
		assert.Equal(t, want, NeedsOptimizer(sel), sel)
	}
	assert.False(t, OpenOptions(Options{Verify: true}).LeaveOptimizer, "--verify checks every chunk")
	assert.True(t, OpenOptions(Options{}).LeaveOptimizer)
}
