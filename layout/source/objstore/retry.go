package objstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/ckptfs/ckptfs/layout/source"
)

// Attempts runs op, one attempt of a request for n bytes named name, up to
// l.MaxAttempts times, each within l.AttemptTimeout(n), while it fails with
// an error transient says is worth retrying (or its deadline passed), with
// jittered exponential backoff between (as Budget counts it). For a store
// whose SDK is told not to retry, so that every attempt has its deadline.
func Attempts(ctx context.Context, l Limits, c *Counters, name string, n int64, transient func(error) bool, op func(ctx context.Context) error) error {
	l = l.WithDefaults()
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, l.AttemptTimeout(n))
		start := time.Now()
		err := op(actx)
		timedOut := err != nil && actx.Err() == context.DeadlineExceeded && ctx.Err() == nil
		cancel()
		if l.ObserveRequest != nil {
			l.ObserveRequest(name, time.Since(start), err)
		}
		if err == nil || errors.Is(err, ErrNotFound) {
			return err
		}
		retry := timedOut || transient(err)
		if timedOut {
			err = fmt.Errorf("%s: no response within the attempt deadline %v", name, l.AttemptTimeout(n))
		}
		if retry {
			err = Classified(err, source.ErrUnavailable) // no answer, or one worth asking again
		}
		if attempt >= l.MaxAttempts || ctx.Err() != nil || !retry {
			return fmt.Errorf("%s, %d attempts: %w", name, attempt, RequestFailed(err))
		}
		c.Retries.Add(1)
		d := min(time.Second<<min(attempt-1, 30), MaxBackoff)
		select {
		case <-time.After(d/2 + rand.N(d/2+1)):
		case <-ctx.Done():
		}
	}
}

// TransientStatus reports whether an HTTP status is worth retrying:
// throttling and server errors, as the SDKs' retryers have it.
func TransientStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// HTTPClient is the client a store's SDK sends with: connections kept for
// the ranged reads in flight, a response's headers due within ReadTimeout,
// and every request counted in c.
func HTTPClient(l Limits, c *Counters) *http.Client {
	l = l.WithDefaults()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// Read-ahead keeps several ranged reads in flight: keep their
	// connections instead of opening new ones.
	tr.MaxIdleConnsPerHost = 64
	tr.ResponseHeaderTimeout = l.ReadTimeout
	return &http.Client{Transport: countingTransport{tr, c}}
}

type countingTransport struct {
	http.RoundTripper
	c *Counters
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.c.Requests.Add(1)
	return t.RoundTripper.RoundTrip(r)
}
