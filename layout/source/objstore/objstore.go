// Package objstore is a source.Tree over a prefix of an object store
// bucket, whatever the store: s3, gcs and azure are each only their client
// calls (Store), and everything else is here, once.
//
// Keys are confined to the prefix: a name is cleaned as a local path (no
// "..", not absolute) and joined below the prefix, and listed keys that
// could not be named that way ("..", empty segments) are not shown. Object
// stores have no symlinks. Directories are the common prefixes of a
// delimited listing; a prefix whose keys fit in one page is listed whole,
// in one request, and every directory under it answered from that. When a
// key is both an object and a prefix of others, the object wins.
//
// A file is a snapshot of its object's version at open (source.Info.Version:
// an S3 or Azure ETag, a GCS generation): every read asks the store for that
// version and checks the response against it, the range asked for and the
// size opened, so a replaced object fails with source.ErrChanged instead of
// mixing old and new bytes.
//
// Every attempt of a request has a total deadline (Limits.AttemptTimeout),
// not only an idle one; a read cut short or past its deadline is resumed
// from where it stopped, at most MaxAttempts times, so a store that
// trickles bytes fails a read (ErrRequest) after about MaxAttempts
// deadlines plus the backoff between them (Limits.Budget).
package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ckptfs/ckptfs/layout/source"
)

// Object is a key as the store describes it.
type Object struct {
	Key     string
	Size    int64
	ModTime time.Time
	// Version is what a read is pinned to: an ETag (quotes dropped), a
	// generation number.
	Version string
}

// Page is one page of a listing.
type Page struct {
	Objects []Object
	// Prefixes are the common prefixes of a delimited listing, each ending
	// in "/".
	Prefixes []string
	// Next continues the listing; "" on the last page.
	Next string
}

// Store is one object store's client calls on one bucket. A Store retries
// a request that fails before its response as its SDK does, each attempt
// within Limits.AttemptTimeout (Attempts does both for a store whose SDK
// does not), and counts its requests.
type Store interface {
	// Head describes the object at key; ErrNotFound when the store says
	// there is none (not for a missing bucket or a refused credential).
	Head(ctx context.Context, key string) (Object, error)
	// List returns the page of keys under prefix that token continues
	// ("" for the first): delimited by "/" when delim is set. limit > 0
	// asks for at most that many keys.
	List(ctx context.Context, prefix string, delim bool, limit int, token string) (Page, error)
	// Read writes the n bytes at off of obj as of obj.Version to w, in one
	// attempt (one ranged request, its body copied with CopyBody, so that
	// w reads it in as it streams), returning how many it wrote. A response
	// of another version, range or size is a *ChangedError, as is a
	// version gone; an attempt that ended early (a cut body, its deadline,
	// a transient failure) is an *AttemptError, which the tree resumes.
	Read(ctx context.Context, obj Object, w io.Writer, off, n int64) (int64, error)
}

// CopyBody copies the n bytes of a response body to w (with w's ReadFrom
// when it has one: no buffer in between); a body that ends early is
// io.ErrUnexpectedEOF.
func CopyBody(w io.Writer, body io.Reader, n int64) (int64, error) {
	got, err := io.CopyN(w, body, n)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return got, err
}

// ErrNotFound is what a Store returns for a key with no object.
var ErrNotFound = errors.New("objstore: no such key")

// ErrRequest is a request to the store that failed after its retries.
var ErrRequest = errors.New("object store request failed")

// ChangedError is a read that found another version than the one opened.
type ChangedError struct{ Cause string }

func (e *ChangedError) Error() string { return e.Cause }

// AttemptError is an attempt that ended before its range did. Like
// RequestFailed, it keeps the cause as text only: a network errno deep in it
// (ECONNRESET) must not become the errno a reader of the mount gets, nor a
// deadline EINTR.
type AttemptError struct{ Cause string }

func (e *AttemptError) Error() string { return fmt.Sprintf("%v: %s", ErrRequest, e.Cause) }
func (e *AttemptError) Is(target error) bool {
	return target == ErrRequest || target == source.ErrUnavailable // ended early: no full answer
}

// RequestFailed keeps the SDK's account of a failed request, on one line,
// but not its chain: a network errno in it (ECONNREFUSED) is no errno of the
// file, and the mount answers EIO. Cancellation stays visible, and so does
// the class the store's error mapping gave it (class.go).
func RequestFailed(err error) error {
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("%w: %w", ErrRequest, context.Canceled)
	}
	if errors.Is(err, ErrRequest) {
		return err
	}
	return &requestError{msg: strings.Join(strings.Fields(err.Error()), " "), class: classOf(err)}
}

// Defaults for zero fields of Limits.
const (
	DefaultMaxAttempts = 5
	DefaultReadTimeout = 30 * time.Second
	DefaultMinRate     = 256 << 10 // bytes per second
	DefaultListTTL     = time.Second
	// MaxBackoff caps the delay before one retry.
	MaxBackoff = 20 * time.Second
)

// Limits bound the requests of a tree, whatever the store.
type Limits struct {
	// MaxAttempts bounds the attempts of one request, retried with
	// jittered exponential backoff on throttling, 5xx and connection
	// errors (default 5).
	MaxAttempts int
	// ReadTimeout fails an attempt whose connection delivers nothing for
	// this long (default 30 s); the attempt is then retried.
	ReadTimeout time.Duration
	// MinRate is the slowest an attempt may transfer, in bytes per second
	// (default 256 KiB/s): each attempt has a total deadline of
	// ReadTimeout plus its bytes at MinRate (AttemptTimeout).
	MinRate int64
	// ListTTL is how long a directory listing answers Stat and Open of the
	// names in it before it is listed again (default 1 s, the entry timeout
	// of a mount's directories). A change within it is still caught by the
	// pinned reads.
	ListTTL time.Duration
	// MinRequest is the least a read that follows its object's last one
	// fetches, the bytes beyond it kept for the reads that follow
	// (ahead.go); 0: every read is its own request.
	MinRequest int64
	// AheadMemory bounds the bytes so fetched ahead and kept, across the
	// tree; 0: none are.
	AheadMemory int64
	// ObserveRequest, if set, is told the time of each attempt of a
	// request by operation name; err is the attempt's error.
	ObserveRequest func(op string, took time.Duration, err error)
}

// WithDefaults fills the zero fields.
func (l Limits) WithDefaults() Limits {
	if l.MaxAttempts <= 0 {
		l.MaxAttempts = DefaultMaxAttempts
	}
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = DefaultReadTimeout
	}
	if l.MinRate <= 0 {
		l.MinRate = DefaultMinRate
	}
	if l.ListTTL <= 0 {
		l.ListTTL = DefaultListTTL
	}
	return l
}

// OtherBytes is what the deadline of a request other than a ranged read
// allows for: a listing page of 1000 keys is well under it.
const OtherBytes = 1 << 20

// AttemptTimeout is the total time one attempt of a request for n bytes
// may take.
func (l Limits) AttemptTimeout(n int64) time.Duration {
	l = l.WithDefaults()
	secs := min(float64(n)/float64(l.MinRate), 1e6) // no Duration overflow at any rate
	return (l.ReadTimeout + time.Duration(secs*float64(time.Second))).Round(time.Millisecond)
}

// Budget is the longest a ranged read of n bytes takes to fail: MaxAttempts
// attempts, each failing by its deadline, and the backoff between them
// (exponential from 1 s, capped at MaxBackoff, as the SDKs' retryers space
// attempts; the tree's resumes wait less).
func (l Limits) Budget(n int64) time.Duration {
	l = l.WithDefaults()
	var backoff time.Duration
	for i := 1; i < l.MaxAttempts; i++ {
		backoff += min(time.Second<<min(i-1, 30), MaxBackoff)
	}
	return time.Duration(l.MaxAttempts)*l.AttemptTimeout(n) + backoff
}

// resumeBackoff is the delay before resuming a read: jittered exponential.
func resumeBackoff(attempt int) time.Duration {
	d := min(50*time.Millisecond<<min(attempt-1, 10), MaxBackoff)
	return d/2 + rand.N(d/2+1)
}

// Counters are a tree's traffic; see source.Stats. Stores count requests
// and retries, the tree bytes and errors.
type Counters struct {
	Requests, Bytes, Retries, Errors atomic.Int64
}

// Stats is a snapshot of the counters.
func (c *Counters) Stats() source.Stats {
	return source.Stats{Requests: c.Requests.Load(), BytesFetched: c.Bytes.Load(), Retries: c.Retries.Load(), Errors: c.Errors.Load()}
}
