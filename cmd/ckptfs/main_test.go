package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMain lets this test binary stand in for ckptfs where the mount starts
// itself again (the unmount watchdog and a daemonised mount), and where
// mount(8) runs it through a link named ckptfs (TestMountAllMountsOnce).
func TestMain(m *testing.M) {
	asCommand := filepath.Base(os.Args[0]) == "ckptfs"
	if asCommand || len(os.Args) > 1 && (os.Args[1] == watchdogCmd || isDaemonChild()) {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]int64{
		"5GB": 5_000_000_000, "512MiB": 512 << 20, "1048576": 1 << 20, "4m": 4 << 20, "4M": 4 << 20,
		"1.5GiB": 3 << 29, " 20 KB ": 20_000, "7B": 7, "4 MiB": 4 << 20, "64k": 64 << 10, "0": 0,
	} {
		got, err := parseByteSize(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "GB", "-1MB", "five", "1XB", "20EB", "M"} {
		_, err := parseByteSize(bad)
		require.ErrorContains(t, err, "invalid size", bad)
	}
}

// FuzzParseByteSize: a size that parses is not negative and prints as a
// string that parses back to it.
func FuzzParseByteSize(f *testing.F) {
	for _, seed := range []string{"5GB", "512MiB", "1048576", "4m", "1.5GiB", " 20 KB ", "0", "-1MB", "1e3", "9EiB"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseByteSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("%q parsed as %d", s, n)
		}
		back, err := parseByteSize(formatByteSize(n))
		if err != nil || back != n {
			t.Fatalf("%q = %d prints as %q, which parses as %d, %v", s, n, formatByteSize(n), back, err)
		}
	})
}

func TestByteSizeFlag(t *testing.T) {
	for _, n := range []int64{512 << 20, 4 << 20, 5_000_000_000, 1 << 20, 1234567, 1, 3 << 29} {
		s := formatByteSize(n)
		back, err := parseByteSize(s)
		require.NoError(t, err, s)
		require.Equal(t, n, back, "%d prints as %q", n, s)
	}
	require.Equal(t, "512 MiB", formatByteSize(512<<20))
	require.Equal(t, "5.0 GB", formatByteSize(5_000_000_000))

	readAhead := newByteSize(1, true)
	require.NoError(t, readAhead.Set("0")) // whether 0 is allowed is the flag's range (limits)
	require.Zero(t, readAhead.Int64())
	require.ErrorIs(t, readAhead.Set("20EB"), strconv.ErrRange)
	require.ErrorIs(t, readAhead.Set("-1MiB"), strconv.ErrRange)
}

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{}, 2, "a command is needed"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"inspct", "x"}, 2, `unknown command "inspct"; did you mean "inspect"?`},
		{[]string{"export", "only-one-arg"}, 2, "ckptfs export: want SRC OUT, got 1 argument(s)"},
		{[]string{"mount", "--no-such-flag", "a", "b"}, 2, "unknown flag: --no-such-flag"},
		{[]string{"mount", "--cache-size", "lots", "a", "b"}, 2, `invalid size "lots"`},
		{[]string{"mount", "-o", "frob", "a", "b"}, 2, `unknown mount option "frob"`},
		{[]string{"mount", "--world-size", "4", "a", "b"}, 1, "need --rw"},
		{[]string{"mount", "--log-format", "xml", "a", "b"}, 2, `--log-format "xml": want text or json`},
		{[]string{"version", "extra"}, 2, "want no arguments, got 1"},
	} {
		code, _, errs := runCLI(tc.args...)
		require.Equal(t, tc.code, code, "%v: %s", tc.args, errs)
		require.Contains(t, errs, tc.err, tc.args)
		msg, _, _ := strings.Cut(strings.TrimSuffix(errs, "\n"), "\nRun '")
		require.NotContains(t, msg, "\n", "one line")
	}
}

func TestHelperFormIsMount(t *testing.T) {
	root, _ := newRootCmd(nil, nil)
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{dir, "/mnt", "-o", "ro"}, true},
		{[]string{"/no/such/src", "/mnt"}, true},
		{[]string{"s3://bucket/prefix", "/mnt"}, true},
		{[]string{"mount", "a", "b"}, false},
		{[]string{"completion", "bash"}, false},
		{[]string{"help", "mount"}, false},
		{[]string{"frobnicate", "x"}, false},
		{[]string{dir}, false},
		{[]string{"--help"}, false},
		{[]string{"__complete", "mount", ""}, false},
	} {
		require.Equal(t, tc.want, isHelperForm(root, tc.args), "%v", tc.args)
	}
	// The helper form runs the mount command: its errors are the mount's.
	code, _, errs := runCLI(filepath.Join(dir, "missing"), dir, "-o", "foreground")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "ckptfs mount: ")
	require.Contains(t, errs, "missing: no such file or directory")
}

// TestVerboseIsV: -v means --verbose wherever it is taken, never
// --version (issue 34.7: root -v was --version, mount -v --verbose).
func TestVerboseIsV(t *testing.T) {
	code, out, errs := runCLI("-v")
	require.Equal(t, 2, code, out)
	require.Contains(t, errs, "unknown shorthand flag: 'v' in -v")
	root, _ := newRootCmd(io.Discard, io.Discard)
	require.Nil(t, root.Flags().ShorthandLookup("v"))
	mount, _, err := root.Find([]string{"mount"})
	require.NoError(t, err)
	require.Equal(t, "verbose", mount.Flags().ShorthandLookup("v").Name)
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, _ := runCLI(args...)
		require.Equal(t, 0, code)
		require.Regexp(t, `^ckptfs \S+\ncommit ([0-9a-f]{40}(\+dirty)?|unknown)\ngo1\.\S+ `+runtime.GOOS+"/"+runtime.GOARCH+"\n$", out)
	}
}

func TestInspectJSON(t *testing.T) {
	code, out, errs := runCLI("inspect", "--json", filepath.Join("..", "..", "testdata", "nested_optim", "ckpt"))
	require.Equal(t, 0, code, errs)
	var r struct {
		Format  string `json:"format"`
		Tensors []struct {
			Name     string `json:"name"`
			ViewName string `json:"view_name"`
		} `json:"tensors"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Equal(t, "torch-dcp", r.Format)
	for _, tn := range r.Tensors {
		if strings.HasPrefix(tn.Name, "model.") {
			require.Equal(t, strings.TrimPrefix(tn.Name, "model."), tn.ViewName)
		} else {
			require.Empty(t, tn.ViewName, "%s is not in the view", tn.Name)
		}
	}
}
