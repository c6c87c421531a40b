package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/logging"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/ckptfs/ckptfs/layout/source/objstore"
)

// Defaults for zero fields of Options.
const (
	DefaultMaxAttempts = objstore.DefaultMaxAttempts
	DefaultReadTimeout = objstore.DefaultReadTimeout
	DefaultMinRate     = objstore.DefaultMinRate // bytes per second
	DefaultListTTL     = objstore.DefaultListTTL
	// defaultRegion signs requests when no region is configured: S3-compatible
	// stores accept any, and AWS redirects a wrong one with an error naming
	// the bucket's region.
	defaultRegion = "us-east-1"
)

// Options configure a Tree. Credentials and the region come from the SDK's
// standard chain (environment, shared config and profile, web identity,
// container and instance metadata) unless set here.
type Options struct {
	// Endpoint is the URL of an S3-compatible store ("" = AWS_ENDPOINT_URL
	// or AWS_ENDPOINT_URL_S3 if set, else AWS S3).
	Endpoint string
	// PathStyle addresses buckets as ENDPOINT/BUCKET/KEY instead of
	// BUCKET.ENDPOINT/KEY. nil: on when an endpoint is set (what MinIO, Ceph
	// and most S3-compatible stores need), off for AWS.
	PathStyle *bool
	// MaxAttempts bounds the attempts of one request, retried with jittered
	// exponential backoff on throttling, 5xx and connection errors (default
	// 5).
	MaxAttempts int
	// ReadTimeout fails an attempt whose connection delivers nothing for this
	// long (default 30 s); the attempt is then retried.
	ReadTimeout time.Duration
	// MinRate is the slowest an attempt may transfer, in bytes per second
	// (default 256 KiB/s). Each attempt has a total deadline of ReadTimeout
	// plus its bytes at MinRate (a 16 MiB ranged GET: ReadTimeout + 64 s; a
	// HEAD or LIST: ReadTimeout + 4 s), after which it fails and is retried,
	// so a store that trickles bytes fails a read after about MaxAttempts
	// such deadlines instead of holding it forever. The default leaves room
	// for 8 GETs in flight on a 16 Mbit/s link.
	MinRate int64
	// Region signs requests and picks AWS's endpoint ("" = AWS_REGION or
	// the profile's, else us-east-1).
	Region string
	// Profile is the named profile of the shared config and credentials
	// files to use ("" = AWS_PROFILE, else "default").
	Profile string
	// NoSignRequest sends requests unsigned, as an anonymous client: what a
	// public bucket needs, no credentials looked up.
	NoSignRequest bool
	// RequesterPays sends x-amz-request-payer: requester, which a
	// requester-pays bucket demands of every request (the reader's
	// account is billed for them).
	RequesterPays bool
	// ObserveRequest, if set, is told the time of each attempt of a request,
	// from sending it to the response's headers, by SDK operation name
	// (GetObject, HeadObject, ListObjectsV2); err is the attempt's error.
	ObserveRequest func(op string, took time.Duration, err error)
	// ListTTL is how long a directory listing answers Stat and Open of the
	// names in it before it is listed again (default 1 s, the entry timeout
	// of a mount's directories). A change within it is still caught by the
	// conditional reads.
	ListTTL time.Duration
	// MinRequest and AheadMemory: the read-ahead of an object read in
	// order (objstore.Limits).
	MinRequest, AheadMemory int64
}

// limits are the options objstore bounds the tree's requests with.
func (o Options) limits() objstore.Limits {
	return objstore.Limits{MaxAttempts: o.MaxAttempts, ReadTimeout: o.ReadTimeout, MinRate: o.MinRate,
		ListTTL: o.ListTTL, ObserveRequest: o.ObserveRequest, MinRequest: o.MinRequest, AheadMemory: o.AheadMemory}
}

func (o Options) withDefaults() Options {
	l := o.limits().WithDefaults()
	o.MaxAttempts, o.ReadTimeout, o.MinRate, o.ListTTL = l.MaxAttempts, l.ReadTimeout, l.MinRate, l.ListTTL
	return o
}

// Budget is the longest a ranged GET of n bytes takes to fail (see
// objstore.Limits.Budget): the SDK's retryer spaces its attempts as that
// counts.
func (o Options) Budget(n int64) time.Duration { return o.limits().Budget(n) }

// newClient builds the SDK client: the standard credential chain, the
// standard retryer without its client-side retry quota (a FUSE read that
// gives up early is an EIO in a training job; the backoff already spaces
// retries), and counting of every attempt and retry.
func newClient(ctx context.Context, o Options, c *objstore.Counters) (*awss3.Client, error) {
	retryer := func() aws.Retryer {
		return &countingRetryer{RetryerV2: retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts = o.MaxAttempts
			so.RateLimiter = ratelimit.None
			// A LIST or HEAD response cut mid-body fails to decode; the SDK
			// does not retry that by itself. (GET bodies are streamed:
			// File.ReadAt resumes them.)
			so.Retryables = append(so.Retryables, retry.IsErrorRetryableFunc(func(err error) aws.Ternary {
				if errors.Is(err, io.ErrUnexpectedEOF) {
					return aws.TrueTernary
				}
				return aws.UnknownTernary
			}))
		}), retries: &c.Retries}
	}
	httpClient := awshttp.NewBuildableClient().
		WithReadTimeout(o.ReadTimeout).
		WithTransportOptions(func(tr *http.Transport) {
			// Read-ahead keeps several ranged GETs in flight: keep their
			// connections instead of opening new ones.
			tr.MaxIdleConnsPerHost = 64
		})
	// The SDK's own log lines (an IMDS fallback) would bypass the mount's
	// logger; what matters comes back as the error of the request.
	opts := []func(*config.LoadOptions) error{config.WithRetryer(retryer), config.WithHTTPClient(httpClient),
		config.WithLogger(logging.Nop{})}
	if o.Endpoint != "" {
		opts = append(opts, config.WithBaseEndpoint(o.Endpoint))
	}
	if o.Region != "" {
		opts = append(opts, config.WithRegion(o.Region))
	}
	if o.Profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(o.Profile))
	}
	if o.NoSignRequest {
		opts = append(opts, config.WithCredentialsProvider(aws.AnonymousCredentials{}))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, err
	}
	if cfg.Region == "" {
		cfg.Region = defaultRegion
	}
	if !o.NoSignRequest {
		// Looked up once, here: otherwise the first request fails with the
		// last provider's error ("no EC2 IMDS role found"), which says
		// nothing of the other sources or of public buckets.
		if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
			return nil, fmt.Errorf("%w (environment, shared config and credentials files, profile %q, web identity, container and instance role: %v); a public bucket reads with --no-sign-request",
				ErrNoCredentials, profileName(o), err)
		}
	}
	pathStyle := cfg.BaseEndpoint != nil
	if o.PathStyle != nil {
		pathStyle = *o.PathStyle
	}
	return awss3.NewFromConfig(cfg, func(so *awss3.Options) {
		so.UsePathStyle = pathStyle
		// A ranged GET has no checksum of its own to validate; the SDK
		// would log that for every block.
		so.DisableLogOutputChecksumValidationSkipped = true
		so.APIOptions = append(so.APIOptions, func(st *middleware.Stack) error {
			// After the retry middleware: these run once per attempt.
			if err := st.Finalize.Insert(attemptDeadline(o), "Retry", middleware.After); err != nil {
				return err
			}
			if o.RequesterPays {
				if err := st.Build.Add(requesterPays, middleware.After); err != nil {
					return err
				}
			}
			return st.Finalize.Insert(middleware.FinalizeMiddlewareFunc("ckptfsCountRequests",
				func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
					c.Requests.Add(1)
					start := time.Now()
					out, md, err := next.HandleFinalize(ctx, in)
					if o.ObserveRequest != nil {
						o.ObserveRequest(middleware.GetOperationName(ctx), time.Since(start), err)
					}
					return out, md, err
				}), "Retry", middleware.After)
		})
	}), nil
}

// ErrNoCredentials is a signed client with no credentials to sign with.
var ErrNoCredentials = errors.New("s3: no credentials found")

func profileName(o Options) string {
	switch {
	case o.Profile != "":
		return o.Profile
	case os.Getenv("AWS_PROFILE") != "":
		return os.Getenv("AWS_PROFILE")
	}
	return "default"
}

// requesterPays adds the header to every request of every operation (one
// place rather than the RequestPayer field of each input), before signing:
// it is one of the signed headers.
var requesterPays = middleware.BuildMiddlewareFunc("ckptfsRequesterPays",
	func(ctx context.Context, in middleware.BuildInput, next middleware.BuildHandler) (middleware.BuildOutput, middleware.Metadata, error) {
		if req, ok := in.Request.(*smithyhttp.Request); ok {
			req.Header.Set("x-amz-request-payer", "requester")
		}
		return next.HandleBuild(ctx, in)
	})

// attemptBytesKey carries the length of a ranged GET to its attempts'
// deadline.
type attemptBytesKey struct{}

func withAttemptBytes(ctx context.Context, n int64) context.Context {
	return context.WithValue(ctx, attemptBytesKey{}, n)
}

// attemptTimeout is the total time one attempt of a request for n bytes
// may take (see Options.MinRate).
func (o Options) attemptTimeout(n int64) time.Duration { return o.limits().AttemptTimeout(n) }

// attemptDeadline bounds each attempt from sending the request to the last
// byte of its body: the transport's ReadTimeout is idle-only, and a store
// that sends a byte a second would hold a read forever. A GET's body is
// read after the call returns, so its deadline is released when the body is
// closed.
func attemptDeadline(o Options) middleware.FinalizeMiddleware {
	return middleware.FinalizeMiddlewareFunc("ckptfsAttemptDeadline",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			n, ok := ctx.Value(attemptBytesKey{}).(int64)
			if !ok {
				n = objstore.OtherBytes
			}
			ctx, cancel := context.WithTimeout(ctx, o.attemptTimeout(n))
			out, md, err := next.HandleFinalize(ctx, in)
			if get, ok := out.Result.(*awss3.GetObjectOutput); ok && err == nil {
				get.Body = cancelOnClose{get.Body, cancel}
			} else {
				cancel()
			}
			return out, md, err
		})
}

// cancelOnClose is a response body that ends its attempt's context when
// closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// countingRetryer counts the retries the SDK makes: it asks for a delay
// once before each.
type countingRetryer struct {
	aws.RetryerV2
	retries *atomic.Int64
}

func (r *countingRetryer) RetryDelay(attempt int, err error) (time.Duration, error) {
	r.retries.Add(1)
	return r.RetryerV2.RetryDelay(attempt, err)
}
