// Package gcs is the gs:// store of objstore: a source.Tree over a Google
// Cloud Storage bucket prefix, read with cloud.google.com/go/storage
// (listings and metadata through the JSON API, ranged reads through the XML
// API, the library's default: its JSON reads refuse the Accept-Encoding
// that keeps a gzip-encoded object's stored bytes and size). This package is
// only its client calls; naming, confinement, listings as directories and
// the resumed, pinned reads are objstore's.
//
// Credentials are Application Default Credentials (GOOGLE_APPLICATION_
// CREDENTIALS, gcloud's, the metadata server) unless Options.Anonymous;
// STORAGE_EMULATOR_HOST, when set, points every request at an emulator
// (fake-gcs-server), unauthenticated, as the Google libraries do.
//
// An object's version is its generation: every read asks for that
// generation (a replaced object has a new one, and the old one is gone
// unless the bucket keeps versions) and checks the response's generation,
// offset and size, so a replaced object fails with source.ErrChanged, never
// with mixed bytes. The SDK's own retries are off: objstore.Attempts
// retries with a deadline on every attempt.
package gcs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	htransport "google.golang.org/api/transport/http"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
)

// Scheme starts every location this package opens.
const Scheme = "gs://"

// IsURL reports whether s names a GCS location (gs://...).
func IsURL(s string) bool { return strings.HasPrefix(s, Scheme) }

// bucketName is what GCS accepts: lower-case letters, digits, dots, hyphens
// and underscores, 3 to 222 characters (63 between dots).
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$`)

// ParseURL parses gs://BUCKET[/PREFIX] (see objstore.ParseURL).
func ParseURL(s string) (objstore.Location, error) {
	return objstore.ParseURL(s, Scheme, "gs", bucketName.MatchString)
}

// Options configure a tree.
type Options struct {
	objstore.Limits
	// Endpoint is the URL of the JSON API ("" = STORAGE_EMULATOR_HOST if
	// set, else Google's).
	Endpoint string
	// Anonymous sends requests without credentials: what a public bucket
	// needs, no credentials looked up.
	Anonymous bool
}

// Open returns the tree at url (gs://BUCKET[/PREFIX]); ctx bounds finding
// the credentials. It lists the prefix once: a prefix with no objects under
// it is an error, as a missing directory is.
func Open(ctx context.Context, url string, o Options) (*objstore.Tree, error) {
	loc, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	c := new(objstore.Counters)
	client, err := newClient(ctx, o, c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", loc, err)
	}
	s := &store{client: client, bkt: client.Bucket(loc.Bucket), limits: o.Limits, count: c}
	return objstore.Open(loc, s, o.Limits, c)
}

// newClient builds the client over objstore's counting HTTP client:
// authenticated by ADC unless anonymous or an emulator, one attempt per
// call.
func newClient(ctx context.Context, o Options, c *objstore.Counters) (*storage.Client, error) {
	hc := objstore.HTTPClient(o.Limits, c)
	hc.Transport = generationCheck{hc.Transport}
	emulator := o.Endpoint == "" && os.Getenv("STORAGE_EMULATOR_HOST") != ""
	if !o.Anonymous && !emulator {
		tr, err := htransport.NewTransport(ctx, hc.Transport, option.WithScopes(storage.ScopeReadOnly))
		if err != nil {
			return nil, fmt.Errorf("%w (Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login, the metadata server: %v); a public bucket reads with --no-sign-request", ErrNoCredentials, err)
		}
		hc.Transport = tr
	}
	opts := []option.ClientOption{option.WithHTTPClient(hc)}
	if o.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(strings.TrimSuffix(o.Endpoint, "/")+"/storage/v1/"))
	}
	client, err := storage.NewClient(ctx, opts...)
	if err != nil {
		return nil, err
	}
	client.SetRetry(storage.WithPolicy(storage.RetryNever))
	return client, nil
}

// ErrNoCredentials is a client with no credentials to send requests with.
var ErrNoCredentials = errors.New("gs: no credentials found")

// store is the GCS calls on one bucket.
type store struct {
	client *storage.Client
	bkt    *storage.BucketHandle
	limits objstore.Limits
	count  *objstore.Counters
}

// Close closes the client (objstore.Tree.Close calls it).
func (s *store) Close() error { return s.client.Close() }

func (s *store) Head(ctx context.Context, key string) (objstore.Object, error) {
	var obj objstore.Object
	err := objstore.Attempts(ctx, s.limits, s.count, "objects.get", objstore.OtherBytes, transient, func(ctx context.Context) error {
		a, err := s.bkt.Object(key).Attrs(ctx)
		if errors.Is(err, storage.ErrObjectNotExist) {
			return objstore.ErrNotFound
		}
		if err != nil {
			return classify(err)
		}
		obj = object(a)
		return nil
	})
	return obj, err
}

func object(a *storage.ObjectAttrs) objstore.Object {
	return objstore.Object{Key: a.Name, Size: a.Size, ModTime: a.Updated, Version: strconv.FormatInt(a.Generation, 10)}
}

func (s *store) List(ctx context.Context, prefix string, delim bool, limit int, token string) (objstore.Page, error) {
	q := &storage.Query{Prefix: prefix}
	if delim {
		q.Delimiter = "/"
	}
	if err := q.SetAttrSelection([]string{"Name", "Size", "Updated", "Generation"}); err != nil {
		return objstore.Page{}, err
	}
	size := 1000
	if limit > 0 {
		size = min(limit, size)
	}
	var page objstore.Page
	err := objstore.Attempts(ctx, s.limits, s.count, "objects.list", objstore.OtherBytes, transient, func(ctx context.Context) error {
		var attrs []*storage.ObjectAttrs
		next, err := iterator.NewPager(s.bkt.Objects(ctx, q), size, token).NextPage(&attrs)
		if err != nil {
			return classify(err)
		}
		page = objstore.Page{Next: next}
		for _, a := range attrs {
			if a.Prefix != "" {
				page.Prefixes = append(page.Prefixes, a.Prefix)
			} else {
				page.Objects = append(page.Objects, object(a))
			}
		}
		return nil
	})
	return page, err
}

// Read is one ranged read of the opened generation, as stored (no
// decompressive transcoding: the size is the stored object's). The read is
// the whole attempt, under its deadline; a transient failure or a cut body
// is an AttemptError, resumed by the tree.
func (s *store) Read(ctx context.Context, obj objstore.Object, w io.Writer, off, n int64) (int64, error) {
	gen, err := strconv.ParseInt(obj.Version, 10, 64)
	if err != nil {
		return 0, &objstore.ChangedError{Cause: fmt.Sprintf("generation %q is no number", obj.Version)}
	}
	timeout := s.limits.AttemptTimeout(n)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, err := s.bkt.Object(obj.Key).Generation(gen).ReadCompressed(true).NewRangeReader(ctx, off, n)
	if err != nil {
		return 0, readError(ctx, err, gen, timeout)
	}
	defer r.Close()
	// The response's generation was checked by generationCheck (the
	// Reader's Attrs.Generation is the one asked for, not the answer's);
	// its range and size come from Content-Range and Content-Length.
	if r.Attrs.StartOffset != off || r.Remain() != n || r.Attrs.Size != obj.Size {
		return 0, &objstore.ChangedError{Cause: fmt.Sprintf("asked for %d bytes at %d of %d, got %d at %d of %d",
			n, off, obj.Size, r.Remain(), r.Attrs.StartOffset, r.Attrs.Size)}
	}
	got, err := objstore.CopyBody(w, r, n)
	if err != nil {
		return got, readError(ctx, err, gen, timeout)
	}
	return got, nil
}

// readError tells a generation gone (404: replaced or deleted) from an
// attempt to resume (its deadline, a cut body, a transient failure) and a
// failed request.
func readError(ctx context.Context, err error, gen int64, timeout time.Duration) error {
	var other *generationError
	switch {
	case errors.As(err, &other):
		return &objstore.ChangedError{Cause: other.Error()}
	case errors.Is(err, storage.ErrObjectNotExist):
		return &objstore.ChangedError{Cause: fmt.Sprintf("generation %d is gone (replaced or deleted)", gen)}
	case errors.Is(err, context.Canceled):
		return objstore.RequestFailed(err)
	case ctx.Err() == context.DeadlineExceeded:
		return &objstore.AttemptError{Cause: fmt.Sprintf("attempt deadline %v passed", timeout)}
	case errors.Is(err, io.ErrUnexpectedEOF) || transient(err):
		return &objstore.AttemptError{Cause: err.Error()}
	}
	return objstore.RequestFailed(classify(err))
}

// generationCheck fails a successful read of a pinned generation whose
// response does not say it is that generation (x-goog-generation): a store
// or proxy that ignores the generation asked for would otherwise serve
// another version's bytes, and the storage Reader reports the generation
// asked for, not the one answered.
type generationCheck struct{ http.RoundTripper }

func (g generationCheck) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := g.RoundTripper.RoundTrip(r)
	asked := r.URL.Query().Get("generation")
	if err != nil || r.Method != http.MethodGet || asked == "" || r.URL.Query().Get("alt") == "json" ||
		res.StatusCode < 200 || res.StatusCode > 299 {
		return res, err
	}
	if got := res.Header.Get("X-Goog-Generation"); got != asked {
		res.Body.Close()
		return nil, &generationError{asked, got}
	}
	return res, nil
}

// generationError is a response of another generation than asked for.
type generationError struct{ asked, got string }

func (e *generationError) Error() string {
	if e.got == "" {
		return fmt.Sprintf("the store did not say which generation it answered a read of generation %s with", e.asked)
	}
	return fmt.Sprintf("the store answered with generation %s, not %s (the generation asked for was ignored: replaced)", e.got, e.asked)
}

// classify marks an SDK error with what it says of the store: its HTTP
// status (objstore.StatusClass), or no answer at all.
func classify(err error) error {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return objstore.Classified(err, objstore.StatusClass(ge.Code))
	}
	if objstore.Unanswered(err) {
		return objstore.Classified(err, source.ErrUnavailable)
	}
	return err
}

// transient is what the SDK would have retried, and a cut response.
func transient(err error) bool {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return objstore.TransientStatus(ge.Code)
	}
	return storage.ShouldRetry(err) || errors.Is(err, io.ErrUnexpectedEOF)
}
