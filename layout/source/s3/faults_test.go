package s3_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
	"github.com/ckptfs/ckptfs/layout/source/s3"
	"github.com/ckptfs/ckptfs/layout/source/s3/s3test"
)

// TestGatewayFaults: a real gateway (versitygw) that is killed, frozen
// (SIGSTOP), slow, answering 5xx, or whose object is replaced between two
// reads fails the read with an error that maps to EIO (never ENOENT),
// within MaxAttempts × (ReadTimeout + bytes/MinRate) plus the backoff and a
// little slack; a burst of 5xx shorter than the attempts is retried
// through. Each case reads 32 KiB at 4096 of a 64 KiB object, opened
// before the fault, with MaxAttempts 2 and ReadTimeout 1 s.
func TestGatewayFaults(t *testing.T) {
	const (
		size     = 64 << 10
		off      = 4096
		n        = 32 << 10
		attempts = 2
		timeout  = time.Second
		rate     = s3.DefaultMinRate
	)
	// The bound of the issue: every attempt up to its deadline, plus the
	// SDK's and the resume's backoff (under a second for 2 attempts) and
	// scheduling slack.
	bound := attempts*(timeout+time.Duration(n)*time.Second/rate) + 2*time.Second
	data := bytes.Repeat([]byte("old!"), size/4)
	var burstLeft atomic.Int32 // the 500s of the short burst not yet sent
	for _, tc := range []struct {
		name   string
		direct bool // no proxy: the client talks to the gateway's own socket
		fault  func(t *testing.T, g *s3test.Server, p *objstoretest.Proxy)
		want   error // nil: the read succeeds
		class  error // what the failure says of the store (source.ErrUnavailable, source.ErrDenied)
		cause  string
		min    time.Duration
		sent   func() bool // whether the fault was sent, where the read succeeds
	}{
		{name: "killed", direct: true, fault: func(t *testing.T, g *s3test.Server, p *objstoretest.Proxy) { g.Kill(t) },
			want: s3.ErrRequest, class: source.ErrUnavailable, cause: "connection refused"},
		{name: "frozen", direct: true, fault: func(t *testing.T, g *s3test.Server, p *objstoretest.Proxy) {
			g.Signal(t, syscall.SIGSTOP)
			t.Cleanup(func() { g.Signal(t, syscall.SIGCONT) })
		}, want: s3.ErrRequest, class: source.ErrUnavailable, cause: "timeout limit, 1s", min: attempts * timeout},
		{name: "slow body", fault: func(t *testing.T, g *s3test.Server, p *objstoretest.Proxy) {
			p.SetFault(func(*http.Request) objstoretest.Fault { return objstoretest.Fault{Rate: 4 << 10} })
		}, want: s3.ErrRequest, class: source.ErrUnavailable, cause: "attempt deadline", min: attempts * timeout},
		{name: "slow headers", fault: func(t *testing.T, g *s3test.Server, p *objstoretest.Proxy) {
			p.SetFault(func(*http.Request) objstoretest.Fault { return objstoretest.Fault{Delay: time.Minute} })
		}, want: s3.ErrRequest, class: source.ErrUnavailable, cause: "timeout limit, 1s", min: attempts * timeout},
		{name: "5xx burst longer than the attempts", fault: func(t *testing.T, g *s3test.Server, p *objstoretest.Proxy) {
			p.SetFault(func(*http.Request) objstoretest.Fault {
				return objstoretest.Fault{Status: http.StatusServiceUnavailable}
			})
		}, want: s3.ErrRequest, class: source.ErrUnavailable, cause: "StatusCode: 503"},
		{name: "403 denied", fault: func(t *testing.T, g *s3test.Server, p *objstoretest.Proxy) {
			p.SetFault(func(*http.Request) objstoretest.Fault { return objstoretest.Fault{Status: http.StatusForbidden} })
		}, want: s3.ErrRequest, class: source.ErrDenied, cause: "StatusCode: 403"},
		{name: "5xx burst shorter than the attempts", fault: func(t *testing.T, g *s3test.Server, p *objstoretest.Proxy) {
			burstLeft.Store(attempts - 1)
			p.SetFault(func(*http.Request) objstoretest.Fault {
				if burstLeft.Load() > 0 {
					burstLeft.Add(-1) // SetFault's func runs under the proxy's lock
					return objstoretest.Fault{Status: http.StatusInternalServerError}
				}
				return objstoretest.Fault{}
			})
		}, sent: func() bool { return burstLeft.Load() == 0 }},
		{name: "replaced", fault: func(t *testing.T, g *s3test.Server, p *objstoretest.Proxy) {
			g.Put(t, "faults", "ckpt/shard", bytes.Repeat([]byte("new!"), size/4))
		}, want: source.ErrChanged, cause: "no longer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := s3test.StartGateway(t, s3test.GatewayOptions{})
			g.Bucket(t, "faults")
			g.Put(t, "faults", "ckpt/shard", data)
			p := objstoretest.StartProxy(t, g.Endpoint, objstoretest.ProxyOptions{})
			endpoint := p.URL
			if tc.direct {
				endpoint = g.Endpoint
			}
			tree, err := s3.Open(context.Background(), "s3://faults/ckpt", s3.Options{Endpoint: endpoint, MaxAttempts: attempts, ReadTimeout: timeout})
			require.NoError(t, err)
			t.Cleanup(func() { tree.Close() })
			f, err := tree.Open("shard")
			require.NoError(t, err)
			buf := make([]byte, n)
			_, err = f.ReadAt(buf, 0) // the store answered before the fault
			require.NoError(t, err)

			tc.fault(t, g, p)
			took, err := objstoretest.TimedRead(t, f, buf, off, bound)
			assert.GreaterOrEqual(t, took, tc.min)
			assert.Less(t, took, bound)
			if tc.want == nil {
				require.NoError(t, err)
				assert.Equal(t, data[off:off+n], buf)
				assert.True(t, tc.sent(), "the fault was sent")
				return
			}
			require.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.cause)
			if tc.class != nil {
				require.ErrorIs(t, err, tc.class)
				assert.NotEqual(t, errors.Is(err, source.ErrDenied), source.IsUnavailable(err), "one class: %v", err)
			}
			requireEIO(t, err, "s3://faults/ckpt/shard")
			assert.False(t, bytes.Contains(buf, []byte("new!")), "bytes of another version were served")
		})
	}
}
