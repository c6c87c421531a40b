package dcpwrite

import (
	"strings"
	"testing"
)

// FuzzParseRules: the --plan file parser never panics, and every rule it
// accepts places any tensor on a dimension it has, or replicates it.
func FuzzParseRules(f *testing.F) {
	f.Add("q_proj|k_proj|v_proj 0\no_proj 1\n# norms\nnorm replicate\n")
	f.Add("(unclosed 0\n")
	f.Add(".* -1\n")
	f.Add("a 99999999999999999999\n")
	f.Fuzz(func(t *testing.T, plan string) {
		rules, err := ParseRules(strings.NewReader(plan))
		if err != nil {
			return
		}
		target := Target{WorldSize: 3, Rules: rules}
		for _, shape := range [][]int64{{}, {5}, {4, 7}, {2, 3, 4}} {
			d := target.Dim("model.layers.0.self_attn.q_proj.weight", len(shape))
			if d != Replicate && (d < 0 || d >= len(shape)) {
				t.Fatalf("rules %q place a rank-%d tensor on dim %d", plan, len(shape), d)
			}
		}
	})
}
