package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// TestEveryNumericFlagHasALimit: every numeric flag of every command has a
// range in limits, its default is inside it, and --help shows it.
func TestEveryNumericFlagHasALimit(t *testing.T) {
	root, _ := newRootCmd(nil, nil)
	seen := map[string]bool{}
	for _, cmd := range root.Commands() {
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			switch f.Value.Type() {
			case "bool", "string", "stringArray", "FILE", "dtype":
				return
			}
			l, ok := limits[f.Name]
			require.True(t, ok, "%s --%s (%s) has no range in limits", cmd.Name(), f.Name, f.Value.Type())
			seen[f.Name] = true
			n := l.value(f)
			require.True(t, l.min <= n && n <= l.max, "--%s default %s outside %s", f.Name, f.DefValue, l)
			require.Contains(t, f.Usage, "(range "+l.String(), "--%s --help", f.Name)
		})
	}
	for name := range limits {
		require.True(t, seen[name], "limits has --%s, which no command has", name)
	}
}

// TestHostileValues: out-of-range values of every limited flag, given as a
// flag or as an -o option, are one usage error naming the flag and its range
// (exit status 2), before anything is built: issue 22's block_size=1 made
// ristretto allocate 26 GB and prefetch=2147483647 died of OOM in cache.New.
func TestHostileValues(t *testing.T) {
	const (
		maxInt32 = "2147483647"
		twoTo63  = "9223372036854775808"
		hugeSize = "99999999EiB"
	)
	for _, tc := range []struct {
		flag, value, shown string // shown: the value as the error prints it
	}{
		{"cache-size", "0", "0 B"},
		{"cache-size", "1", "1 B"},
		{"cache-size", "-1", "-1"},
		{"cache-size", twoTo63, twoTo63},
		{"cache-size", hugeSize, hugeSize},
		{"block-size", "0", "0 B"},
		{"block-size", "1", "1 B"},
		{"block-size", "-4KiB", "-4KiB"},
		{"block-size", maxInt32, "2147483647"},
		{"block-size", hugeSize, hugeSize},
		{"prefetch", "-1", "-1"},
		{"prefetch", maxInt32, maxInt32},
		{"prefetch", twoTo63, twoTo63},
		{"read-ahead", maxInt32, "2147483647"},
		{"read-ahead", "-1", "-1"},
		{"read-ahead", hugeSize, hugeSize},
		{"max-shard-size", "0", "0 B"},
		{"max-shard-size", "1", "1 B"},
		{"max-shard-size", hugeSize, hugeSize},
		{"cache-dir-size", "0", "0 B"},
		{"cache-dir-size", "1", "1 B"},
		{"cache-dir-size", twoTo63, twoTo63},
		{"max-attempts", "0", "0"},
		{"max-attempts", "-1", "-1"},
		{"max-attempts", maxInt32, maxInt32},
		{"max-attempts", twoTo63, twoTo63},
		{"read-timeout", "0s", "0s"},
		{"read-timeout", "-1s", "-1s"},
		{"read-timeout", "1ns", "1ns"},
		{"read-timeout", "2562047h", "2562047h"},
		{"min-rate", "0", "0 B"},
		{"min-rate", "1023", "1023 B"},
		{"min-rate", "-1", "-1"},
		{"min-rate", "2GiB", "2.0 GiB"},
		{"min-rate", hugeSize, hugeSize},
		{"world-size", "0", "0"},
		{"world-size", "-1", "-1"},
		{"world-size", maxInt32, maxInt32},
		{"world-size", twoTo63, twoTo63},
	} {
		want := "ckptfs mount: --" + tc.flag + " " + tc.shown + " out of range " + limits[tc.flag].String() + "\n"
		option := strings.ReplaceAll(tc.flag, "-", "_") + "=" + tc.value
		for _, args := range [][]string{
			{"mount", "--" + tc.flag + "=" + tc.value, "src", "mnt"},
			{"mount", "-o", "ro," + option, "src", "mnt"},
			{"src/", "mnt", "-o", option}, // as mount(8) runs it: refused before daemonising
		} {
			code, _, errs := runCLI(args...)
			require.Equal(t, 2, code, "%v: %s", args, errs)
			msg, _, _ := strings.Cut(errs, "Run '")
			require.Equal(t, want, msg, args)
		}
	}
	// --workers is export's.
	code, _, errs := runCLI("export", "--workers", "0", "src", "out")
	require.Equal(t, 2, code, errs)
	require.True(t, strings.HasPrefix(errs, "ckptfs export: --workers 0 out of range [1, 256]\n"), errs)
	code, _, errs = runCLI("inspect", "--max-shard-size", "1", "src")
	require.Equal(t, 2, code, errs)
	require.True(t, strings.HasPrefix(errs, "ckptfs inspect: --max-shard-size 1 B out of range [1 KiB, 1 PiB]\n"), errs)
}

// TestLimitsAcceptTheirBounds: the ends of each range pass, one past them
// does not; and a cache of too many blocks is refused even when both sizes
// are in range.
func TestLimitsAcceptTheirBounds(t *testing.T) {
	check := func(args ...string) error {
		flags := newMountCmd(new([]string)).Flags()
		require.NoError(t, flags.Parse(args))
		return checkLimits(flags)
	}
	for _, args := range [][]string{
		{"--block-size", "4KiB", "--cache-size", "16GiB"},
		{"--block-size", "64MiB", "--cache-size", "16TiB"},
		{"--cache-size", "1MiB", "--prefetch", "0", "--read-ahead", "0"},
		{"--prefetch", "256", "--read-ahead", "1GiB", "--max-attempts", "100", "--read-timeout", "1h", "--world-size", "65536"},
		{"--max-attempts", "1", "--read-timeout", "1s", "--world-size", "1", "--max-shard-size", "1MiB", "--cache-dir-size", "64MiB"},
		{"--min-rate", "1KiB"},
		{"--min-rate", "1GiB"},
	} {
		require.NoError(t, check(args...), args)
	}
	for _, args := range [][]string{
		{"--block-size", "4095"},
		{"--block-size", "67108865"},
		{"--prefetch", "257"},
		{"--read-timeout", "999ms"},
		{"--world-size", "65537"},
		{"--min-rate", "1023"},
		{"--min-rate", "1073741825"},
	} {
		require.ErrorContains(t, check(args...), "out of range", args)
	}
	require.EqualError(t, check("--block-size", "4KiB", "--cache-size", "1TiB"),
		"--cache-size 1.0 TiB is 268435456 blocks of --block-size 4.0 KiB: at most 4194304")
}
