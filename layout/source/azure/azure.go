// Package azure is the az:// store of objstore: a source.Tree over an Azure
// Blob Storage container prefix (az://CONTAINER/PREFIX), read with the Azure
// SDK for Go (azblob). This package is only its client calls; naming,
// confinement, listings as directories and the resumed, pinned reads are
// objstore's.
//
// The account and credentials, first found wins: Options.Anonymous (a
// public container: no credentials); AZURE_STORAGE_CONNECTION_STRING;
// else the account (Options.Account or AZURE_STORAGE_ACCOUNT, at
// Options.Endpoint or https://ACCOUNT.blob.core.windows.net) with
// AZURE_STORAGE_SAS_TOKEN, AZURE_STORAGE_KEY, or azidentity's default
// credential chain (environment, workload identity, managed identity,
// Azure CLI).
//
// An object's version is its ETag: every read is a ranged GET of the bytes
// as stored (no decompression of a gzip-encoded blob) with If-Match on it,
// checked against the ETag, range and size of the response,
// so a replaced blob fails with source.ErrChanged, never with mixed bytes.
// The SDK's own retries are off: objstore.Attempts retries with a deadline
// on every attempt.
package azure

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
)

// Scheme starts every location this package opens.
const Scheme = "az://"

// IsURL reports whether s names an Azure location (az://...).
func IsURL(s string) bool { return strings.HasPrefix(s, Scheme) }

// containerName is what Azure accepts: lower-case letters, digits and
// single hyphens, 3 to 63 characters ("$root" aside).
var containerName = regexp.MustCompile(`^[a-z0-9]([a-z0-9]|-[a-z0-9]){2,62}$`)

// ParseURL parses az://CONTAINER[/PREFIX] (see objstore.ParseURL).
func ParseURL(s string) (objstore.Location, error) {
	return objstore.ParseURL(s, Scheme, "az", func(c string) bool { return len(c) <= 63 && containerName.MatchString(c) })
}

// Options configure a tree.
type Options struct {
	objstore.Limits
	// Account is the storage account ("" = AZURE_STORAGE_ACCOUNT).
	Account string
	// Endpoint is the account's blob service URL ("" =
	// https://ACCOUNT.blob.core.windows.net; an emulator's is
	// http://127.0.0.1:10000/ACCOUNT).
	Endpoint string
	// Anonymous sends requests without credentials (a container open to
	// public read).
	Anonymous bool
}

// Open returns the tree at url (az://CONTAINER[/PREFIX]). It lists the
// prefix once: a prefix with no blobs under it is an error, as a missing
// directory is.
func Open(ctx context.Context, url string, o Options) (*objstore.Tree, error) {
	loc, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	c := new(objstore.Counters)
	client, err := newClient(o, c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", loc, err)
	}
	s := &store{c: client.ServiceClient().NewContainerClient(loc.Bucket), limits: o.Limits, count: c}
	return objstore.Open(loc, s, o.Limits, c)
}

// ErrNoAccount is a client with no account to address.
var ErrNoAccount = errors.New("az: no storage account: set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT (--account) with a SAS token, key or Azure identity")

// newClient builds the client over objstore's counting HTTP client, one
// attempt per call.
func newClient(o Options, c *objstore.Counters) (*azblob.Client, error) {
	co := &azblob.ClientOptions{ClientOptions: azcore.ClientOptions{
		Transport:       objstore.HTTPClient(o.Limits, c),
		Retry:           policy.RetryOptions{MaxRetries: -1}, // objstore.Attempts retries
		PerCallPolicies: []policy.Policy{storedBytes{}},
	}}
	if conn := os.Getenv("AZURE_STORAGE_CONNECTION_STRING"); conn != "" && !o.Anonymous && o.Account == "" && o.Endpoint == "" {
		return azblob.NewClientFromConnectionString(conn, co)
	}
	account := o.Account
	if account == "" {
		account = os.Getenv("AZURE_STORAGE_ACCOUNT")
	}
	endpoint := o.Endpoint
	if endpoint == "" {
		if account == "" {
			return nil, ErrNoAccount
		}
		endpoint = "https://" + account + ".blob.core.windows.net/"
	}
	endpoint = strings.TrimSuffix(endpoint, "/") + "/"
	if o.Anonymous {
		return azblob.NewClientWithNoCredential(endpoint, co)
	}
	if sas := strings.TrimPrefix(os.Getenv("AZURE_STORAGE_SAS_TOKEN"), "?"); sas != "" {
		if _, err := url.ParseQuery(sas); err != nil {
			return nil, fmt.Errorf("AZURE_STORAGE_SAS_TOKEN: %w", err)
		}
		return azblob.NewClientWithNoCredential(endpoint+"?"+sas, co)
	}
	if key := os.Getenv("AZURE_STORAGE_KEY"); key != "" {
		if account == "" {
			return nil, ErrNoAccount
		}
		cred, err := azblob.NewSharedKeyCredential(account, key)
		if err != nil {
			return nil, fmt.Errorf("AZURE_STORAGE_KEY: %w", err)
		}
		return azblob.NewClientWithSharedKeyCredential(endpoint, cred, co)
	}
	cred, err := azidentity.NewDefaultAzureCredential(&azidentity.DefaultAzureCredentialOptions{ClientOptions: co.ClientOptions})
	if err != nil {
		return nil, fmt.Errorf("az: no credentials found (%v); a public container reads with --no-sign-request", err)
	}
	return azblob.NewClient(endpoint, cred, co)
}

// storedBytes asks for a blob's bytes as stored. Azure's range is the
// x-ms-range header, not Range, so Go's HTTP client would otherwise ask for
// gzip itself and decompress a response with Content-Encoding: gzip: a
// blob stored so (azcopy --content-encoding) would fail every read, its
// Content-Length gone and a range of it no gzip stream.
type storedBytes struct{}

func (storedBytes) Do(req *policy.Request) (*http.Response, error) {
	req.Raw().Header.Set("Accept-Encoding", "identity")
	return req.Next()
}

// store is the Blob calls on one container.
type store struct {
	c      *container.Client
	limits objstore.Limits
	count  *objstore.Counters
}

func (s *store) Head(ctx context.Context, key string) (objstore.Object, error) {
	var obj objstore.Object
	err := objstore.Attempts(ctx, s.limits, s.count, "GetBlobProperties", objstore.OtherBytes, transient, func(ctx context.Context) error {
		p, err := s.c.NewBlobClient(key).GetProperties(ctx, nil)
		switch {
		case bloberror.HasCode(err, bloberror.BlobNotFound):
			return objstore.ErrNotFound
		case err != nil:
			return brief(err)
		}
		obj = object(key, p.ContentLength, p.LastModified, p.ETag)
		return nil
	})
	return obj, err
}

func object(key string, size *int64, mtime *time.Time, etag *azcore.ETag) objstore.Object {
	o := objstore.Object{Key: key}
	if size != nil {
		o.Size = *size
	}
	if mtime != nil {
		o.ModTime = *mtime
	}
	if etag != nil {
		o.Version = normalizeETag(string(*etag))
	}
	return o
}

// normalizeETag drops the quotes, which listings and responses may or may
// not keep.
func normalizeETag(etag string) string { return strings.Trim(etag, `"`) }

func (s *store) List(ctx context.Context, prefix string, delim bool, limit int, token string) (objstore.Page, error) {
	var page objstore.Page
	var max *int32
	if limit > 0 {
		max = new(int32)
		*max = int32(min(limit, 5000))
	}
	var marker *string
	if token != "" {
		marker = &token
	}
	err := objstore.Attempts(ctx, s.limits, s.count, "ListBlobs", objstore.OtherBytes, transient, func(ctx context.Context) error {
		page = objstore.Page{}
		var items []*container.BlobItem
		if delim {
			resp, err := s.c.NewListBlobsHierarchyPager("/", &container.ListBlobsHierarchyOptions{Prefix: &prefix, Marker: marker, MaxResults: max}).NextPage(ctx)
			if err != nil {
				return brief(err)
			}
			for _, p := range resp.Segment.BlobPrefixes {
				if p.Name != nil {
					page.Prefixes = append(page.Prefixes, *p.Name)
				}
			}
			items, page.Next = resp.Segment.BlobItems, deref(resp.NextMarker)
		} else {
			resp, err := s.c.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{Prefix: &prefix, Marker: marker, MaxResults: max}).NextPage(ctx)
			if err != nil {
				return brief(err)
			}
			items, page.Next = resp.Segment.BlobItems, deref(resp.NextMarker)
		}
		for _, b := range items {
			if b.Name == nil || b.Properties == nil {
				continue
			}
			page.Objects = append(page.Objects, object(*b.Name, b.Properties.ContentLength, b.Properties.LastModified, b.Properties.ETag))
		}
		return nil
	})
	return page, err
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Read is one ranged GET of len(p) bytes at off, If-Match the opened ETag.
func (s *store) Read(ctx context.Context, obj objstore.Object, w io.Writer, off, n int64) (int64, error) {
	timeout := s.limits.AttemptTimeout(n)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	etag := azcore.ETag(`"` + obj.Version + `"`)
	resp, err := s.c.NewBlobClient(obj.Key).DownloadStream(ctx, &blob.DownloadStreamOptions{
		Range:            blob.HTTPRange{Offset: off, Count: n},
		AccessConditions: &blob.AccessConditions{ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: &etag}},
	})
	if err != nil {
		return 0, s.readError(ctx, err, obj, timeout)
	}
	defer resp.Body.Close()
	want := objstore.ContentRange{First: off, Last: off + n - 1, Size: obj.Size}
	switch got := object(obj.Key, resp.ContentLength, nil, resp.ETag); {
	case got.Version != obj.Version:
		return 0, &objstore.ChangedError{Cause: fmt.Sprintf("the store answered with ETag %q, not %q (If-Match ignored: replaced)", got.Version, obj.Version)}
	case objstore.ParseContentRange(deref(resp.ContentRange)) != want:
		return 0, &objstore.ChangedError{Cause: fmt.Sprintf("asked for bytes %d-%d/%d, got Content-Range %q", want.First, want.Last, want.Size, deref(resp.ContentRange))}
	case got.Size != n:
		return 0, &objstore.ChangedError{Cause: fmt.Sprintf("asked for %d bytes at %d, got Content-Length %d", n, off, got.Size)}
	}
	got, err := objstore.CopyBody(w, resp.Body, n)
	if err != nil {
		return got, s.readError(ctx, err, obj, timeout)
	}
	return got, nil
}

// readError tells a changed blob (412: the ETag no longer matches; 404:
// gone) from an attempt to resume (its deadline, a cut body, a transient
// failure) and a failed request.
func (s *store) readError(ctx context.Context, err error, obj objstore.Object, timeout time.Duration) error {
	switch {
	case bloberror.HasCode(err, bloberror.ConditionNotMet):
		return &objstore.ChangedError{Cause: fmt.Sprintf("its ETag is no longer %q (replaced or rewritten)", obj.Version)}
	case bloberror.HasCode(err, bloberror.BlobNotFound):
		return &objstore.ChangedError{Cause: "vanished"}
	case errors.Is(err, context.Canceled):
		return objstore.RequestFailed(err)
	case ctx.Err() == context.DeadlineExceeded:
		return &objstore.AttemptError{Cause: fmt.Sprintf("attempt deadline %v passed", timeout)}
	case transient(err):
		return &objstore.AttemptError{Cause: brief(err).Error()}
	}
	return objstore.RequestFailed(brief(err))
}

// brief is a failed request in one short line (the SDK's message for a
// response is a dump of the request and response over many): its status
// and error code, and never the URL's query, which holds a SAS token's
// signature, marked with what it says of the store (classify). The error
// stays in the chain, for transient to see.
func brief(err error) error {
	var re *azcore.ResponseError
	var ue *url.Error
	switch {
	case errors.As(err, &re) && re.RawResponse != nil && re.RawResponse.Request != nil:
		req := re.RawResponse.Request
		err = &briefError{fmt.Sprintf("%s %s: %s (%s)", req.Method, noQuery(req.URL), re.RawResponse.Status, re.ErrorCode), err}
	case errors.As(err, &ue):
		u, perr := url.Parse(ue.URL)
		if perr != nil {
			err = &briefError{fmt.Sprintf("%s: %v", ue.Op, ue.Err), err}
		} else {
			err = &briefError{fmt.Sprintf("%s %s: %v", ue.Op, noQuery(u), ue.Err), err}
		}
	}
	return classify(err)
}

// classify marks an SDK error with what it says of the store: its HTTP
// status (objstore.StatusClass), or no answer at all.
func classify(err error) error {
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		return objstore.Classified(err, objstore.StatusClass(re.StatusCode))
	}
	if objstore.Unanswered(err) {
		return objstore.Classified(err, source.ErrUnavailable)
	}
	return err
}

func noQuery(u *url.URL) string {
	c := *u
	c.RawQuery, c.User = "", nil
	return c.String()
}

type briefError struct {
	msg string
	err error
}

func (e *briefError) Error() string { return e.msg }
func (e *briefError) Unwrap() error { return e.err }

// transient is what the SDK's retry policy would have retried: throttling,
// server errors, and a request that got no response (a refused or cut
// connection); not a credential that cannot be had (azidentity's errors
// say so), which would only fail again.
func transient(err error) bool {
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		return objstore.TransientStatus(re.StatusCode)
	}
	var final interface{ NonRetriable() }
	return !errors.Is(err, context.Canceled) && !errors.As(err, &final)
}
