package main

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLogLevel: --log-level, -v, -q and --debug pick the least level
// logged; two of the first three, or --debug with a level that hides its
// traces, are a usage error.
func TestLogLevel(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want slog.Level
		err  string
	}{
		{nil, slog.LevelInfo, ""},
		{[]string{"--log-level", "error"}, slog.LevelError, ""},
		{[]string{"--log-level", "WARN"}, slog.LevelWarn, ""},
		{[]string{"-o", "log_level=debug"}, slog.LevelDebug, ""},
		{[]string{"-q"}, slog.LevelWarn, ""},
		{[]string{"-o", "quiet"}, slog.LevelWarn, ""},
		{[]string{"-v"}, slog.LevelDebug, ""},
		{[]string{"--debug"}, slog.LevelDebug, ""},
		{[]string{"--debug", "-v"}, slog.LevelDebug, ""},
		{[]string{"--log-level", "loud"}, 0, `--log-level "loud": want debug, info, warn or error`},
		{[]string{"--log-level", "info+2"}, 0, "want debug, info, warn or error"},
		{[]string{"-q", "-v"}, 0, "contradict"},
		{[]string{"-q", "--log-level", "info"}, 0, "contradict"},
		{[]string{"--debug", "-q"}, 0, "--debug logs its traces at level debug"},
	} {
		var f mountFlags
		flags := pflag.NewFlagSet("mount", pflag.ContinueOnError)
		f.register(flags)
		require.NoError(t, flags.Parse(tc.args))
		_, err := applyOptions(flags, f.options)
		require.NoError(t, err)
		level, err := f.level()
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.args)
			continue
		}
		require.NoError(t, err, tc.args)
		assert.Equal(t, tc.want, level, tc.args)
	}
}

// TestStartupErrorInLogFile: a mount that fails to start says why in
// --log-file too (mount(8) gives it no stderr to read).
func TestStartupErrorInLogFile(t *testing.T) {
	lf := filepath.Join(t.TempDir(), "ckptfs.log")
	code, _, errs := runCLI("mount", "--log-file", lf, "--log-format", "json", filepath.Join(t.TempDir(), "missing"), t.TempDir())
	require.Equal(t, 1, code, errs)
	b, err := os.ReadFile(lf)
	require.NoError(t, err)
	var rec map[string]any
	require.NoError(t, json.Unmarshal(b, &rec), string(b))
	assert.Equal(t, "ERROR", rec["level"])
	assert.Equal(t, "mount failed", rec["msg"])
	assert.Contains(t, rec["err"], "missing")
}

// TestDebugTracesThroughTheLogger: --debug's FUSE request traces are
// records of the mount's logger, in --log-format json to --log-file, not
// log.Printf lines on stderr.
func TestDebugTracesThroughTheLogger(t *testing.T) {
	lf := filepath.Join(t.TempDir(), "ckptfs.log")
	mnt, unmount := mountSample(t, "--debug", "--log-format", "json", "--log-file", lf)
	_, err := os.ReadFile(filepath.Join(mnt, "ckpt", "config.json"))
	require.NoError(t, err)
	unmount()
	b, err := os.ReadFile(lf)
	require.NoError(t, err)
	traces := 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if rec["from"] == "go-fuse" {
			traces++
			assert.Equal(t, "DEBUG", rec["level"], line)
		}
	}
	assert.Greater(t, traces, 10, "FUSE request traces in the log file")
	assert.Contains(t, string(b), "LOOKUP")
}
