// Command ckptfs shows training checkpoints (PyTorch DCP, HF-sharded
// safetensors, Megatron torch_dist) as HuggingFace model directories.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version and commit are set at build time with -ldflags "-X
// main.version=... -X main.commit=..." (the Makefile stamps git describe
// and the commit): Go's own VCS stamp is missing from a build with
// -buildvcs=false or outside a git work tree.
var version, commit = "", ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole command line: it returns the exit status, 2 for bad usage.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == watchdogCmd {
		if err := runWatchdog(args[1:]); err != nil {
			return 1
		}
		return 0
	}
	defer profile()()
	root, helper := newRootCmd(stdout, stderr)
	if isHelperForm(root, args) {
		// mount -t fuse.ckptfs (and fstab) run "ckptfs SRC MNT -o OPTS".
		*helper = args
		args = append([]string{"mount"}, args...)
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	var usage *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", cmd.CommandPath(), usage.err, cmd.CommandPath())
		return 2
	default:
		fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), err)
		return 1
	}
}

// newRootCmd builds the command tree. helper is set to the original
// arguments when they are in the mount helper form.
func newRootCmd(stdout, stderr io.Writer) (*cobra.Command, *[]string) {
	helper := new([]string)
	root := &cobra.Command{
		Use:   "ckptfs SRC MNT -o OPTION[,OPTION...]",
		Short: "Show training checkpoints as HuggingFace model directories",
		Long: `ckptfs shows training checkpoints as HuggingFace model directories, without copying them.

"ckptfs SRC MNT -o OPTIONS" is how mount -t fuse.ckptfs and /etc/fstab run it:
"ckptfs mount SRC MNT -o OPTIONS" that returns once the mount answers, leaving
it served in the background (unless -o foreground).`,
		DisableFlagsInUseLine:      true,
		SuggestionsMinimumDistance: 2,
		Version:                    versionString(),
		Args:                       unknownCommand,
		RunE:                       func(cmd *cobra.Command, args []string) error { return &usageError{errors.New("a command is needed")} },
		SilenceErrors:              true,
		SilenceUsage:               true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("ckptfs {{.Version}}\n")
	// --version has no short form: -v is --verbose, wherever it is taken.
	root.Flags().Bool("version", false, "print the version (as ckptfs version)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		if r := overflowError(err); r != nil {
			return r
		}
		return &usageError{err}
	})
	root.AddCommand(newMountCmd(helper), newUmountCmd(), newInspectCmd(), newExportCmd(), newVersionCmd())
	for _, c := range root.Commands() {
		documentLimits(c.Flags())
	}
	completeValues(root)
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	return root, helper
}

// isHelperForm reports whether args are "SRC MNT ..." rather than a command:
// the first argument is no command and names an existing path or has a '/'.
func isHelperForm(root *cobra.Command, args []string) bool {
	if len(args) < 2 || strings.HasPrefix(args[0], "-") || strings.HasPrefix(args[0], "__") {
		return false
	}
	if cmd, _, err := root.Find(args[:1]); err == nil && cmd != root {
		return false
	}
	_, err := os.Stat(args[0])
	return err == nil || strings.Contains(args[0], "/")
}

func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	err := fmt.Errorf("unknown command %q", args[0])
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		err = fmt.Errorf("%w; did you mean %q?", err, s[0])
	}
	return &usageError{err}
}

// usageError is bad arguments: exit status 2 and a pointer to --help.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// positional checks the number of positional arguments; names are listed in
// the error ("SRC MNT").
func positional(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			want := strings.Join(names, " ")
			if want == "" {
				want = "no arguments"
			}
			return &usageError{fmt.Errorf("want %s, got %d argument(s)", want, len(args))}
		}
		return nil
	}
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "ckptfs %s\n", versionString())
			return nil
		},
	}
}

// versionString is what version and --version print: the version, the
// commit it was built from (vcs.revision, "+dirty" for a modified tree),
// the Go version and the platform.
func versionString() string {
	v, commit := buildInfo()
	return fmt.Sprintf("%s\ncommit %s\n%s %s/%s", v, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// buildInfo is the version and commit of this binary.
func buildInfo() (v, rev string) {
	v, rev = version, commit
	if v == "" {
		v = "devel"
	}
	if rev != "" {
		return v, rev
	}
	rev = "unknown"
	if info, ok := debug.ReadBuildInfo(); ok {
		if v == "devel" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v = info.Main.Version
		}
		dirty := ""
		for _, s := range info.Settings {
			switch {
			case s.Key == "vcs.revision":
				rev = s.Value
			case s.Key == "vcs.modified" && s.Value == "true":
				dirty = "+dirty"
			}
		}
		rev += dirty
	}
	return v, rev
}
