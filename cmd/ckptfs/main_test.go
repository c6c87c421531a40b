package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]int64{
		"5GB": 5_000_000_000, "512MiB": 512 << 20, "1048576": 1 << 20, "4m": 4 << 20,
		"1.5GiB": 3 << 29, " 20 KB ": 20_000, "7B": 7,
	} {
		got, err := parseByteSize(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "GB", "-1MB", "0", "five", "1XB"} {
		_, err := parseByteSize(bad)
		require.Error(t, err, bad)
	}
}

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestUsage(t *testing.T) {
	code, out, _ := runCLI("--help")
	require.Equal(t, 0, code)
	for _, c := range commands() {
		require.Contains(t, out, c.name)
	}
	code, _, errs := runCLI("frobnicate")
	require.Equal(t, 2, code)
	require.Contains(t, errs, `unknown command "frobnicate"`)
	code, _, errs = runCLI("export", "only-one-arg")
	require.Equal(t, 2, code)
	require.Contains(t, errs, "expected 2 argument(s)")
	code, _, errs = runCLI("mount", "--world-size", "4", "a", "b")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "need --rw")
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
