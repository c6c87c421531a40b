package main

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/help")

// TestHelpGolden pins what --help prints for every command (on stdout, exit
// status 0). After a deliberate change: go test ./cmd/ckptfs -run Help -update
func TestHelpGolden(t *testing.T) {
	for _, args := range [][]string{{}, {"mount"}, {"umount"}, {"inspect"}, {"export"}, {"version"}} {
		name := "ckptfs"
		if len(args) > 0 {
			name = args[0]
		}
		t.Run(name, func(t *testing.T) {
			code, out, errs := runCLI(append(args, "--help")...)
			require.Equal(t, 0, code, errs)
			require.Empty(t, errs)
			golden := filepath.Join("testdata", "help", name+".txt")
			if *update {
				require.NoError(t, os.MkdirAll(filepath.Dir(golden), 0o755))
				require.NoError(t, os.WriteFile(golden, []byte(out), 0o644))
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "no golden file: run with -update")
			require.Equal(t, string(want), out, "--help changed: run with -update if that is intended")
		})
	}
}

// TestHelpEverywhere: "help CMD" and "CMD -h" print the same as "CMD --help".
func TestHelpEverywhere(t *testing.T) {
	for _, cmd := range []string{"mount", "inspect", "export"} {
		_, want, _ := runCLI(cmd, "--help")
		_, viaHelp, _ := runCLI("help", cmd)
		_, short, _ := runCLI(cmd, "-h")
		require.Equal(t, want, viaHelp, cmd)
		require.Equal(t, want, short, cmd)
	}
}

func TestCompletionScripts(t *testing.T) {
	for shell, marker := range map[string]string{"bash": "__start_ckptfs", "zsh": "#compdef ckptfs", "fish": "complete -c ckptfs"} {
		code, out, errs := runCLI("completion", shell)
		require.Equal(t, 0, code, errs)
		require.Contains(t, out, marker, shell)
	}
	// Completion knows the mount flags and their fixed values.
	_, out, _ := runCLI("__complete", "mount", "--log-format", "")
	require.Contains(t, out, "text\njson\n")
	_, out, _ = runCLI("__complete", "mount", "--cache")
	require.Contains(t, out, "--cache-size")
}
