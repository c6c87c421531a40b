package objstore

import (
	"fmt"
	"path"
	"strings"

	"github.com/ckptfs/ckptfs/layout/source"
)

// Location is a bucket (an Azure container) and a key prefix, the top of a
// tree.
type Location struct {
	// Scheme starts its URL: "s3://", "gs://", "az://".
	Scheme string
	Bucket string
	// Prefix is "" (the bucket's top) or a cleaned key prefix without a
	// trailing slash: "runs/llama".
	Prefix string
}

// ParseURL parses SCHEME BUCKET[/PREFIX], the bucket checked by
// validBucket. The prefix is confined like a local path: no "..", "." or
// empty segments, so the tree's top is exactly the prefix written. Errors
// start with what ("s3", "gs", "az").
func ParseURL(s, scheme, what string, validBucket func(string) bool) (Location, error) {
	rest, ok := strings.CutPrefix(s, scheme)
	if !ok {
		return Location{}, fmt.Errorf("%s: %q is not a %s URL", what, s, scheme)
	}
	bucket, prefix, _ := strings.Cut(rest, "/")
	if !validBucket(bucket) {
		return Location{}, fmt.Errorf("%s: %s: invalid bucket name %q", what, s, bucket)
	}
	bad := fmt.Errorf("%s: %s: the prefix must be a plain path (no \"..\", \".\" or empty segments)", what, s)
	if strings.HasPrefix(prefix, "/") {
		return Location{}, bad
	}
	prefix = strings.TrimSuffix(prefix, "/")
	if prefix != "" {
		clean, err := source.Clean(prefix)
		if err != nil || clean != prefix || clean == "." { // "." is clean, and would prefix every key with "./"
			return Location{}, bad
		}
	}
	return Location{Scheme: scheme, Bucket: bucket, Prefix: prefix}, nil
}

// String is the location as a URL.
func (l Location) String() string { return l.URL(".") }

// Key is the object key of a tree name (cleaned by source.Clean): the
// prefix joined with it, never anything outside the prefix.
func (l Location) Key(name string) string {
	if name == "." {
		return l.Prefix
	}
	if l.Prefix == "" {
		return name
	}
	return l.Prefix + "/" + name
}

// DirPrefix is the key prefix listing the directory name: "" or ending in
// a slash.
func (l Location) DirPrefix(name string) string {
	if k := l.Key(name); k != "" {
		return k + "/"
	}
	return ""
}

// URL names a tree name for messages: SCHEME bucket/key.
func (l Location) URL(name string) string {
	return l.Scheme + path.Join(l.Bucket, l.Key(name))
}

// Within returns loc's directory in root (both of one scheme), "." when
// they are the same location.
func Within(loc, root Location) (string, error) {
	rel, ok := strings.CutPrefix(loc.Prefix, root.Prefix)
	if root.Prefix != "" && rel != "" {
		rel, ok = strings.CutPrefix(rel, "/")
	}
	if loc.Scheme != root.Scheme || loc.Bucket != root.Bucket || !ok {
		return "", fmt.Errorf("%s is not inside --root %s", loc, root)
	}
	if rel == "" {
		rel = "."
	}
	return rel, nil
}
