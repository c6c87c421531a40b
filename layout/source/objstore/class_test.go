package objstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
)

func TestStatusClass(t *testing.T) {
	for code, want := range map[int]error{
		http.StatusUnauthorized: source.ErrDenied, http.StatusForbidden: source.ErrDenied,
		http.StatusTooManyRequests: source.ErrUnavailable, http.StatusInternalServerError: source.ErrUnavailable,
		http.StatusServiceUnavailable: source.ErrUnavailable, 599: source.ErrUnavailable,
		http.StatusRequestTimeout: source.ErrUnavailable,
		http.StatusNotFound:       nil, http.StatusPreconditionFailed: nil, http.StatusBadRequest: nil,
	} {
		assert.Equal(t, want, StatusClass(code), "%d", code)
	}
}

func TestUnanswered(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, err := range []error{context.DeadlineExceeded, refused, fmt.Errorf("get: %w", syscall.ECONNRESET)} {
		assert.True(t, Unanswered(err), "%v", err)
	}
	for _, err := range []error{errors.New("AccessDenied"), context.Canceled, ErrNotFound} {
		assert.False(t, Unanswered(err), "%v", err)
	}
}

// RequestFailed flattens the SDK's error to text, keeping its class and
// no errno of its chain.
func TestRequestFailedKeepsTheClass(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	err := RequestFailed(Classified(fmt.Errorf("head:\n %w", refused), source.ErrUnavailable))
	require.ErrorIs(t, err, ErrRequest)
	require.True(t, source.IsUnavailable(err))
	assert.False(t, errors.Is(err, source.ErrDenied))
	assert.False(t, errors.Is(err, syscall.ECONNREFUSED), "no errno of the SDK's chain")
	assert.Equal(t, "object store request failed: head: dial tcp: connection refused", err.Error())
	assert.Same(t, err, RequestFailed(err), "failed once, kept as it is")

	denied := RequestFailed(Classified(errors.New("StatusCode: 403"), source.ErrDenied))
	assert.True(t, errors.Is(denied, source.ErrDenied))
	assert.False(t, source.IsUnavailable(denied))
	plain := RequestFailed(errors.New("StatusCode: 400"))
	assert.False(t, errors.Is(plain, source.ErrDenied) || source.IsUnavailable(plain), "an answer about the request")
	assert.True(t, source.IsUnavailable(&AttemptError{Cause: "cut"}))
}

// Attempts: retries exhausted on what is worth retrying, or on deadlines,
// mean the store did not answer; a failure not worth retrying keeps the
// class its store gave it.
func TestAttemptsClass(t *testing.T) {
	l := Limits{MaxAttempts: 1, ReadTimeout: 50 * time.Millisecond} // one attempt: no backoff to wait
	c := &Counters{}
	transient := func(err error) bool { return errors.Is(err, errFlaky) }
	err := Attempts(context.Background(), l, c, "op", 0, transient, func(context.Context) error { return errFlaky })
	require.True(t, source.IsUnavailable(err), "%v", err)
	err = Attempts(context.Background(), l, c, "op", 0, transient, func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	require.True(t, source.IsUnavailable(err), "%v", err)
	err = Attempts(context.Background(), l, c, "op", 0, transient, func(context.Context) error {
		return Classified(errors.New("403"), source.ErrDenied)
	})
	require.True(t, errors.Is(err, source.ErrDenied), "%v", err)
	require.False(t, source.IsUnavailable(err))
}

var errFlaky = errors.New("503 slow down")
