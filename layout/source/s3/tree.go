// Package s3 is the s3:// store of objstore: a source.Tree over an S3
// bucket prefix (AWS S3 or an S3-compatible store), read with the AWS SDK
// for Go v2. This package is only its client calls; naming, confinement,
// listings as directories and the resumed, pinned reads are objstore's.
//
// An object's version is its ETag: every read is a ranged GET with
// If-Match on it, and every response is checked against that ETag, the
// range asked for and the size opened (a store may ignore If-Match or
// Range), so a replaced object fails with source.ErrChanged instead of
// mixing old and new bytes.
//
// Every attempt of a request has a total deadline, not only the idle
// Options.ReadTimeout: ReadTimeout plus its bytes at Options.MinRate
// (defaults: 30 s + 64 s for a 16 MiB ranged GET). The SDK retries a
// request that fails before its body; an attempt past its deadline or cut
// mid-body is resumed by objstore, so a store that trickles bytes fails a
// read (ErrRequest) after about MaxAttempts deadlines plus the backoff
// between them.
package s3

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
)

// Tree is the objects under a bucket prefix, read-only.
type Tree = objstore.Tree

// ErrRequest is a request to the store that failed after its retries.
var ErrRequest = objstore.ErrRequest

// Open returns the tree at url (s3://BUCKET[/PREFIX]); ctx bounds loading
// the configuration. It lists the prefix once: a prefix with no objects
// under it is an error, as a missing directory is.
func Open(ctx context.Context, url string, o Options) (*Tree, error) {
	loc, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	o = o.withDefaults()
	c := new(objstore.Counters)
	client, err := newClient(ctx, o, c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", loc, err)
	}
	t, err := objstore.Open(loc, &store{client: client, bucket: loc.Bucket, opts: o}, o.limits(), c)
	if err != nil && !o.RequesterPays && errors.Is(err, source.ErrDenied) {
		// S3 refuses a requester-pays bucket's reader with a plain 403
		// AccessDenied, which names neither the cause nor the option.
		return nil, fmt.Errorf("%w; a requester-pays bucket reads with --requester-pays", err)
	}
	return t, err
}

// store is the S3 calls on one bucket.
type store struct {
	client *awss3.Client
	bucket string
	opts   Options
}

func (s *store) Head(ctx context.Context, key string) (objstore.Object, error) {
	out, err := s.client.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: &s.bucket, Key: &key})
	if err != nil {
		return objstore.Object{}, lookupError(err)
	}
	return objstore.Object{Key: key, Size: aws.ToInt64(out.ContentLength), ModTime: aws.ToTime(out.LastModified),
		Version: normalizeETag(aws.ToString(out.ETag))}, nil
}

func (s *store) List(ctx context.Context, prefix string, delim bool, limit int, token string) (objstore.Page, error) {
	in := &awss3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &prefix}
	if delim {
		in.Delimiter = aws.String("/")
	}
	if limit > 0 {
		in.MaxKeys = aws.Int32(int32(min(limit, 1000)))
	}
	if token != "" {
		in.ContinuationToken = &token
	}
	out, err := s.client.ListObjectsV2(ctx, in)
	if err != nil {
		return objstore.Page{}, lookupError(err)
	}
	var page objstore.Page
	for _, cp := range out.CommonPrefixes {
		page.Prefixes = append(page.Prefixes, aws.ToString(cp.Prefix))
	}
	for _, o := range out.Contents {
		page.Objects = append(page.Objects, objstore.Object{Key: aws.ToString(o.Key), Size: aws.ToInt64(o.Size),
			ModTime: aws.ToTime(o.LastModified), Version: normalizeETag(aws.ToString(o.ETag))})
	}
	if aws.ToBool(out.IsTruncated) {
		page.Next = aws.ToString(out.NextContinuationToken)
	}
	return page, nil
}

// normalizeETag drops the quotes, which HEAD and LIST responses may or may
// not keep, so the Version from either compares equal.
func normalizeETag(etag string) string { return strings.Trim(etag, `"`) }

// lookupError tells a missing key from a failed request. A 404 is a missing
// key only when the store says so (NoSuchKey, or NotFound: a HEAD has no
// body): a missing bucket, or versitygw's unknown access key, is a 404 too,
// and must not show as an empty directory.
func lookupError(err error) error {
	var re *awshttp.ResponseError
	var api smithy.APIError
	if errors.As(err, &re) && re.HTTPStatusCode() == 404 &&
		(!errors.As(err, &api) || api.ErrorCode() == "NoSuchKey" || api.ErrorCode() == "NotFound") {
		return objstore.ErrNotFound
	}
	return objstore.RequestFailed(classify(err))
}

// classify marks an SDK error with what it says of the store: its HTTP
// status (objstore.StatusClass), else the SDK's retries exhausted or no
// answer at all (source.ErrUnavailable).
func classify(err error) error {
	var re *awshttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() != 0 { // 0: the request got no response
		return objstore.Classified(err, objstore.StatusClass(re.HTTPStatusCode()))
	}
	var exhausted *retry.MaxAttemptsError
	if errors.As(err, &exhausted) || objstore.Unanswered(err) {
		return objstore.Classified(err, source.ErrUnavailable)
	}
	return err
}
