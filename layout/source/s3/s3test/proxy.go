package s3test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"
)

// Proxy forwards HTTP requests to a server, recording each one and applying
// the Fault its FaultFunc picks: what a test needs to see the headers a
// client sends, or to make a real server slow or failing.
type Proxy struct {
	// URL is the proxy's endpoint: http://127.0.0.1:PORT.
	URL string

	mu    sync.Mutex
	reqs  []Request                   // GUARDED_BY(mu)
	fault func(r *http.Request) Fault // GUARDED_BY(mu)
}

// Request is one request the proxy received.
type Request struct {
	Method, Path, RawQuery string
	Header                 http.Header
}

// Fault is what the proxy does to one request. The zero Fault forwards it.
type Fault struct {
	// Status, if set, answers the request with this status and an S3 error
	// body instead of forwarding it.
	Status int
	// Delay holds the request this long before forwarding it (or
	// answering Status).
	Delay time.Duration
	// Rate, if set, sends the response body at this many bytes per second.
	Rate int
}

// StartProxy starts a proxy to target (a server's Endpoint), stopped at the
// end of the test.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1 // a trickled body reaches the client as it trickles
	// A client that gives up (a deadline) is no failure of the test.
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) { w.WriteHeader(http.StatusBadGateway) }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.reqs = append(p.reqs, Request{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone()})
		var f Fault
		if p.fault != nil {
			f = p.fault(r)
		}
		p.mu.Unlock()
		if f.Delay > 0 {
			select {
			case <-time.After(f.Delay):
			case <-r.Context().Done():
				return
			}
		}
		if f.Status != 0 {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(f.Status)
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code><Message>injected %d</Message></Error>`, f.Status)
			return
		}
		if f.Rate > 0 {
			w = &throttled{ResponseWriter: w, rate: f.Rate}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

// SetFault sets what the proxy does to each request from now on (nil:
// forward every one).
func (p *Proxy) SetFault(f func(r *http.Request) Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault = f
}

// Requests returns the requests received so far.
func (p *Proxy) Requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Request(nil), p.reqs...)
}

// throttled writes a response body at rate bytes per second, in pieces of
// a tenth of a second's worth.
type throttled struct {
	http.ResponseWriter
	rate int
}

func (w *throttled) Write(b []byte) (int, error) {
	piece := max(1, w.rate/10)
	done := 0
	for done < len(b) {
		n := min(piece, len(b)-done)
		if _, err := w.ResponseWriter.Write(b[done : done+n]); err != nil {
			return done, err
		}
		done += n
		w.Flush()
		time.Sleep(time.Duration(n) * time.Second / time.Duration(w.rate))
	}
	return done, nil
}

func (w *throttled) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// ReadFrom hides the ResponseWriter's, which would copy past Write.
func (w *throttled) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{w}, r)
}
