package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestApplyOptions(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string // flags given besides -o
		options    []string
		flags      map[string]string // flag -> value after applying
		kernel     []string
		foreground bool
		err        string
	}{
		{name: "none"},
		{name: "sizes with underscores", options: []string{"cache_size=1GiB,block_size=4M,read_ahead=0"},
			flags: map[string]string{"cache-size": "1.0 GiB", "block-size": "4.0 MiB", "read-ahead": "0 B"}},
		{name: "dashes too", options: []string{"cache-size=5GB,max-shard-size=500MB"},
			flags: map[string]string{"cache-size": "5.0 GB", "max-shard-size": "500 MB"}},
		{name: "bool flag alone is true", options: []string{"allow_other,verbose"},
			flags: map[string]string{"allow-other": "true", "verbose": "true"}},
		{name: "bool flag with a value", options: []string{"allow_other=false"}, flags: map[string]string{"allow-other": "false"}},
		{name: "string and int flags", options: []string{"select=model,prefetch=8,metrics_addr=127.0.0.1:9100,log_format=json"},
			flags: map[string]string{"select": "model", "prefetch": "8", "metrics-addr": "127.0.0.1:9100", "log-format": "json"}},
		{name: "several -o, later wins", options: []string{"prefetch=1", "prefetch=2"}, flags: map[string]string{"prefetch": "2"}},
		{name: "-o over a flag", args: []string{"--prefetch", "1"}, options: []string{"prefetch=3"}, flags: map[string]string{"prefetch": "3"}},
		{name: "escaped comma in a value", options: []string{`hf_config=/a\,b,ro`}, flags: map[string]string{"hf-config": "/a,b"}, kernel: []string{"ro"}},
		{name: "what mount.fuse3 passes", options: []string{"rw,nosuid,nodev,noexec,relatime,dev,suid"},
			kernel: []string{"nosuid", "nodev", "noexec", "dev", "suid"}, flags: map[string]string{"rw": "false"}},
		{name: "ro", options: []string{"ro"}, kernel: []string{"ro"}, flags: map[string]string{"rw": "false"}},
		{name: "writable is --rw", options: []string{"writable,world_size=4,prefix=model"},
			flags: map[string]string{"rw": "true", "world-size": "4", "prefix": "model"}},
		{name: "default_permissions", options: []string{"default_permissions,allow_other"}, kernel: []string{"default_permissions"},
			flags: map[string]string{"allow-other": "true"}},
		{name: "fstab and systemd options are ignored", options: []string{"defaults,noauto,user,nofail,_netdev,x-systemd.automount,x-systemd.idle-timeout=60,comment=systemd.automount,noatime,async"}},
		{name: "foreground", options: []string{"foreground"}, foreground: true},
		{name: "empty items", options: []string{",ro,,"}, kernel: []string{"ro"}},

		{name: "unknown", options: []string{"ro,frobnicate"}, err: `unknown mount option "frobnicate"`},
		{name: "unknown with value", options: []string{"frob=1"}, err: `unknown mount option "frob"`},
		{name: "-o cannot set -o", options: []string{"option=ro"}, err: `unknown mount option "option"`},
		{name: "help is no option", options: []string{"help"}, err: `unknown mount option "help"`},
		{name: "bad size", options: []string{"cache_size=lots"}, err: `mount option "cache_size=lots": invalid size "lots"`},
		{name: "size too large", options: []string{"cache_size=20EB"}, err: `--cache-size 20EB out of range [1 MiB, 16 TiB]`},
		{name: "int too large", options: []string{"prefetch=9223372036854775808"}, err: `--prefetch 9223372036854775808 out of range [0, 256]`},
		{name: "bad int", options: []string{"prefetch=many"}, err: `mount option "prefetch=many": strconv.ParseInt`},
		{name: "needs a value", options: []string{"cache_size"}, err: `mount option "cache_size" needs a value`},
		{name: "standard option with a value", options: []string{"ro=1"}, err: `mount option "ro" takes no value`},
		{name: "foreground with a value", options: []string{"foreground=yes"}, err: `mount option "foreground" takes no value`},
		{name: "ro and --rw", args: []string{"--rw"}, options: []string{"ro"}, err: "mount option ro contradicts --rw"},
		{name: "ro and writable", options: []string{"writable,ro"}, err: "mount option ro contradicts --rw (-o writable)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags := newMountCmd(new([]string)).Flags()
			require.NoError(t, flags.Parse(tc.args))
			o, err := applyOptions(flags, tc.options)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.kernel, o.kernel)
			require.Equal(t, tc.foreground, o.foreground)
			for name, want := range tc.flags {
				require.Equal(t, want, flags.Lookup(name).Value.String(), name)
			}
		})
	}
}

func TestSplitOptions(t *testing.T) {
	for in, want := range map[string][]string{
		"a":           {"a"},
		"a,b=c":       {"a", "b=c"},
		`a=x\,y,b`:    {"a=x,y", "b"},
		`a\b,c`:       {"ab", "c"},
		"":            {""},
		`trailing\\,`: {`trailing\`, ""},
	} {
		require.Equal(t, want, splitOptions(in), in)
	}
}

// FuzzApplyOptions: any -o string is applied or refused with a one-line
// error; it never panics.
func FuzzApplyOptions(f *testing.F) {
	for _, seed := range []string{"ro,cache_size=1GiB,allow_other", `hf_config=/a\,b`, "x-systemd.automount,nofail",
		"writable,ro", "prefetch=-1", "cache_size", "=", ",,", "option=ro", "log_format=json\n"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, err := applyOptions(newMountCmd(new([]string)).Flags(), []string{s})
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Fatalf("error of more than one line: %q", err)
		}
	})
}
