package objstore

import (
	"regexp"
	"strings"
	"testing"

	"github.com/ckptfs/ckptfs/layout/source"
)

// FuzzParseURL: a URL that parses prints back to itself (less a trailing
// slash), and every name a tree accepts maps to a key under its prefix.
// bucketName is S3's rule, for the fuzz target.
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$`)

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"s3://bucket", "s3://bucket/run/step_1/", "s3://b.c-d/../x", "s3://bucket//x", "s3://bucket/a/./b"} {
		f.Add(s, "step_1/.metadata")
	}
	f.Add("s3://bucket/run", "../secret")
	f.Fuzz(func(t *testing.T, url, name string) {
		loc, err := ParseURL(url, "s3://", "s3", bucketName.MatchString)
		if err != nil {
			return
		}
		if got := loc.String(); got != strings.TrimSuffix(url, "/") {
			t.Fatalf("%q parsed to %+v, prints %q", url, loc, got)
		}
		clean, err := source.Clean(name)
		if err != nil {
			return
		}
		key := loc.Key(clean)
		if loc.Prefix != "" && key != loc.Prefix && !strings.HasPrefix(key, loc.Prefix+"/") {
			t.Fatalf("name %q of %s is key %q, outside the prefix", name, url, key)
		}
		if strings.Contains("/"+key+"/", "/../") {
			t.Fatalf("name %q of %s is key %q", name, url, key)
		}
	})
}
