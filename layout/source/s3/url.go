package s3

import (
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/ckptfs/ckptfs/layout/source"
)

// Scheme starts every location this package opens.
const Scheme = "s3://"

// IsURL reports whether s names an object store location (s3://...).
func IsURL(s string) bool { return strings.HasPrefix(s, Scheme) }

// bucketName is what S3 and the S3-compatible stores accept as a bucket:
// lower-case letters, digits, dots and hyphens (underscores for older
// buckets), 3 to 63 characters.
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$`)

// Location is a bucket and a key prefix, the top of a tree.
type Location struct {
	Bucket string
	// Prefix is "" (the bucket's top) or a cleaned key prefix without a
	// trailing slash: "runs/llama".
	Prefix string
}

// ParseURL parses s3://BUCKET[/PREFIX]. The prefix is confined like a
// local path: no "..", "." or empty segments, so the tree's top is exactly
// the prefix written.
func ParseURL(s string) (Location, error) {
	if !IsURL(s) {
		return Location{}, fmt.Errorf("s3: %q is not an s3:// URL", s)
	}
	rest := strings.TrimPrefix(s, Scheme)
	bucket, prefix, _ := strings.Cut(rest, "/")
	if !bucketName.MatchString(bucket) {
		return Location{}, fmt.Errorf("s3: %s: invalid bucket name %q", s, bucket)
	}
	if strings.HasPrefix(prefix, "/") {
		return Location{}, fmt.Errorf("s3: %s: the prefix must be a plain path (no \"..\", \".\" or empty segments)", s)
	}
	prefix = strings.TrimSuffix(prefix, "/")
	if prefix != "" {
		clean, err := source.Clean(prefix)
		if err != nil || clean != prefix || clean == "." { // "." is clean, and would prefix every key with "./"
			return Location{}, fmt.Errorf("s3: %s: the prefix must be a plain path (no \"..\", \".\" or empty segments)", s)
		}
	}
	return Location{Bucket: bucket, Prefix: prefix}, nil
}

// String is the location as an s3:// URL.
func (l Location) String() string { return l.url(".") }

// key is the object key of a tree name (cleaned by source.Clean): the
// prefix joined with it, never anything outside the prefix.
func (l Location) key(name string) string {
	if name == "." {
		return l.Prefix
	}
	if l.Prefix == "" {
		return name
	}
	return l.Prefix + "/" + name
}

// dirPrefix is the key prefix listing the directory name: "" or ending in
// a slash.
func (l Location) dirPrefix(name string) string {
	if k := l.key(name); k != "" {
		return k + "/"
	}
	return ""
}

// url names a tree name for messages: s3://bucket/key.
func (l Location) url(name string) string {
	return Scheme + path.Join(l.Bucket, l.key(name))
}
