package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFlagValuesComplete: the values of --dtype, --map and --log-level
// complete in the shell (issue 34.7: they did not).
func TestFlagValuesComplete(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"mount", "--dtype", ""}, []string{"bf16", "fp16", "fp32"}},
		{[]string{"inspect", "--dtype", ""}, []string{"bf16", "fp16", "fp32"}},
		{[]string{"export", "--map", ""}, []string{"auto", "none", "megatron-gpt"}},
		{[]string{"mount", "--map", ""}, []string{"auto", "none"}},
		{[]string{"mount", "--log-level", ""}, []string{"debug", "info", "warn", "error"}},
	} {
		code, out, errs := runCLI(append([]string{"__complete"}, tc.args...)...)
		require.Equal(t, 0, code, errs)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		for _, w := range tc.want {
			require.Contains(t, lines, w, "%v: %q", tc.args, out)
		}
	}
}
