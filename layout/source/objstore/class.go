package objstore

// Failures by what they say of the store (source.ErrUnavailable,
// source.ErrDenied), told from the SDK's error by each store's error
// mapping (StatusClass for an HTTP status, Unanswered for the rest) and kept
// through RequestFailed, which flattens the SDK's error to text.

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"

	"github.com/ckptfs/ckptfs/layout/source"
)

// StatusClass is what an HTTP status a store answered with says of it:
// source.ErrDenied for 401 and 403, source.ErrUnavailable for throttling
// and server errors, nil for an answer about the request (404, 412, ...).
func StatusClass(code int) error {
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return source.ErrDenied
	case TransientStatus(code) || code >= 500:
		return source.ErrUnavailable
	}
	return nil
}

// Unanswered reports whether err is a request that got no answer: its
// deadline passed, the connection was refused, reset or cut, or the
// network failed.
func Unanswered(err error) bool {
	var op *net.OpError
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.As(err, &op) || errors.As(err, &ne) && ne.Timeout()
}

// Classified marks err with class (source.ErrUnavailable or
// source.ErrDenied); nil leaves it as it is. err stays in the chain, for
// the store's own checks to see.
func Classified(err, class error) error {
	if err == nil || class == nil || errors.Is(err, class) {
		return err
	}
	return &classified{err: err, class: class}
}

type classified struct{ err, class error }

func (e *classified) Error() string   { return e.err.Error() }
func (e *classified) Unwrap() []error { return []error{e.err, e.class} }

// classOf is the class err was marked with, if any.
func classOf(err error) error {
	switch {
	case errors.Is(err, source.ErrDenied):
		return source.ErrDenied
	case errors.Is(err, source.ErrUnavailable):
		return source.ErrUnavailable
	}
	return nil
}

// requestError is a request that failed after its retries: the SDK's
// account as text (no errno of it reaches a reader of the mount) and its
// class.
type requestError struct {
	msg   string
	class error
}

func (e *requestError) Error() string { return ErrRequest.Error() + ": " + e.msg }

func (e *requestError) Unwrap() []error {
	if e.class == nil {
		return []error{ErrRequest}
	}
	return []error{ErrRequest, e.class}
}
