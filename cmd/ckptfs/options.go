package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// mountOptions is what -o says beyond the flags it sets.
type mountOptions struct {
	foreground bool     // helper form: serve in this process instead of daemonising
	kernel     []string // standard options the kernel applies to the mount
}

// kernelOptions are standard mount options passed to the kernel as a FUSE
// mount applies them.
var kernelOptions = map[string]bool{
	"ro": true, "dev": true, "nodev": true, "suid": true, "nosuid": true,
	"exec": true, "noexec": true, "default_permissions": true,
}

// ignoredOptions are standard options that mean nothing to a ckptfs mount:
// for mount(8), systemd and fstab (auto, user, nofail, _netdev, ...), "rw"
// (mount(8) passes it to every helper, so it cannot turn on the write path:
// that is "writable"), and access-time and sync flags (views are immutable;
// written files are durable at close anyway).
var ignoredOptions = map[string]bool{
	"rw": true, "defaults": true, "auto": true, "noauto": true, "user": true, "nouser": true,
	"users": true, "owner": true, "group": true, "nofail": true, "_netdev": true,
	"atime": true, "noatime": true, "diratime": true, "nodiratime": true, "relatime": true,
	"norelatime": true, "strictatime": true, "lazytime": true, "nolazytime": true,
	"sync": true, "async": true, "dirsync": true,
}

// ignoredPrefixes are option families for other programs: x-systemd.*,
// x-gvfs-show, comment=systemd.* and the like.
var ignoredPrefixes = []string{"x-", "comment="}

// notOptions are flags that -o cannot set.
var notOptions = map[string]bool{"option": true, "help": true}

// applyOptions applies -o options (each value may hold several, comma
// separated, "\," for a comma inside a value) onto the command's flags and
// returns the rest. An option naming a flag sets it, written with "_" or "-"
// (cache_size=1GiB, allow_other, read-ahead=4M); a boolean flag alone means
// true. Unknown options are an error naming them.
func applyOptions(flags *pflag.FlagSet, values []string) (mountOptions, error) {
	var o mountOptions
	var readOnly bool
	for _, value := range values {
		for _, opt := range splitOptions(value) {
			name, val, hasVal := strings.Cut(opt, "=")
			switch {
			case opt == "":
			case name == "foreground" && !hasVal:
				o.foreground = true
			case name == "writable" && !hasVal:
				if err := flags.Set("rw", "true"); err != nil {
					return o, err
				}
			case name == "nonempty" && !hasVal: // libfuse's name for it
				if err := flags.Set("allow-non-empty", "true"); err != nil {
					return o, err
				}
			case kernelOptions[name] && !hasVal:
				o.kernel = append(o.kernel, name)
				readOnly = readOnly || name == "ro"
			case ignoredOptions[name] && !hasVal, hasAnyPrefix(opt, ignoredPrefixes):
			case kernelOptions[name] || ignoredOptions[name] || name == "foreground" || name == "writable" || name == "nonempty":
				return o, fmt.Errorf("mount option %q takes no value", name)
			default:
				if err := setFlagOption(flags, name, val, hasVal); err != nil {
					return o, err
				}
			}
		}
	}
	if rw := flags.Lookup("rw"); readOnly && rw.Value.String() == "true" {
		return o, errors.New("mount option ro contradicts --rw (-o writable)")
	}
	return o, nil
}

// setFlagOption sets the flag an option names.
func setFlagOption(flags *pflag.FlagSet, name, val string, hasVal bool) error {
	flagName := strings.ReplaceAll(name, "_", "-")
	f := flags.Lookup(flagName)
	if f == nil || notOptions[flagName] {
		return fmt.Errorf("unknown mount option %q", name)
	}
	if !hasVal {
		if f.Value.Type() != "bool" {
			return fmt.Errorf("mount option %q needs a value (%s=...)", name, name)
		}
		val = "true"
	}
	if err := flags.Set(flagName, val); err != nil {
		if r := overflowError(err); r != nil {
			return r
		}
		return fmt.Errorf("mount option %q: %w", name+"="+val, unwrapFlagErr(err))
	}
	return nil
}

// unwrapFlagErr drops pflag's own wording around a Value's error.
func unwrapFlagErr(err error) error {
	if u := errors.Unwrap(err); u != nil {
		return u
	}
	return err
}

// splitOptions splits "a,b=c\,d" into "a" and "b=c,d": a backslash takes
// the next character literally, as libfuse reads -o.
func splitOptions(s string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case s[i] == ',':
			out = append(out, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(s[i])
		}
	}
	return append(out, cur.String())
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
