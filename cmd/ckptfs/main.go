// Command ckptfs shows training checkpoints (PyTorch DCP, HF-sharded
// safetensors, Megatron torch_dist) as HuggingFace model directories.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"mount", "mount SRC at MNT: every checkpoint under SRC appears as an HF directory", runMount},
		{"umount", "unmount a ckptfs mount", runUmount},
		{"inspect", "show what a checkpoint holds and the HF view planned from it", runInspect},
		{"export", "write the HF view of a checkpoint to a directory (no FUSE needed)", runExport},
		{"version", "print the version", runVersion},
	}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "ckptfs shows training checkpoints as HuggingFace model directories, without copying them.\n\n")
	fmt.Fprintf(w, "Usage:\n  ckptfs <command> [flags] [args]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'ckptfs <command> --help' for the flags of a command.\n")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == watchdogCmd {
		if err := runWatchdog(args[1:], stdout, stderr); err != nil {
			return 1
		}
		return 0
	}
	for _, c := range commands() {
		if c.name == args[0] {
			err := c.run(args[1:], stdout, stderr)
			switch {
			case err == nil:
				return 0
			case errors.Is(err, flag.ErrHelp):
				return 0
			case errors.Is(err, errUsage):
				return 2
			default:
				fmt.Fprintf(stderr, "ckptfs %s: %v\n", c.name, err)
				return 1
			}
		}
	}
	fmt.Fprintf(stderr, "ckptfs: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

// errUsage reports bad arguments whose message was already printed.
var errUsage = errors.New("usage")

// newFlagSet returns a flag set whose --help prints the command's usage line
// and flags.
func newFlagSet(name, args, about string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ckptfs "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: ckptfs %s [flags] %s\n\n%s\n", name, args, about)
		var any bool
		fs.VisitAll(func(*flag.Flag) { any = true })
		if any {
			fmt.Fprintf(fs.Output(), "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parse parses flags that may come before or after the positional arguments,
// and checks the number of positionals.
func parse(fs *flag.FlagSet, args []string, nargs int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, errUsage
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) != nargs {
		fmt.Fprintf(fs.Output(), "expected %d argument(s), got %d: %s\n\n", nargs, len(pos), strings.Join(pos, " "))
		fs.Usage()
		return nil, errUsage
	}
	return pos, nil
}

func runVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", "", "Print the ckptfs version.", stderr)
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	v := version
	if v == "" {
		v = "devel"
		if info, ok := debug.ReadBuildInfo(); ok {
			for _, s := range info.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 12 {
					v = "devel-" + s.Value[:12]
				}
			}
		}
	}
	fmt.Fprintf(stdout, "ckptfs %s\n", v)
	return nil
}
