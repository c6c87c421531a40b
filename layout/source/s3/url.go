package s3

import (
	"regexp"
	"strings"

	"github.com/ckptfs/ckptfs/layout/source/objstore"
)

// Scheme starts every location this package opens.
const Scheme = "s3://"

// IsURL reports whether s names an S3 location (s3://...).
func IsURL(s string) bool { return strings.HasPrefix(s, Scheme) }

// bucketName is what S3 and the S3-compatible stores accept as a bucket:
// lower-case letters, digits, dots and hyphens (underscores for older
// buckets), 3 to 63 characters.
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$`)

// Location is a bucket and a key prefix, the top of a tree.
type Location = objstore.Location

// ParseURL parses s3://BUCKET[/PREFIX] (see objstore.ParseURL).
func ParseURL(s string) (Location, error) {
	return objstore.ParseURL(s, Scheme, "s3", bucketName.MatchString)
}
