package objstoretest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Proxy is a reverse proxy in front of a store's server: it records what a
// client sends (each request, each TCP connection opened to it) and applies
// the Fault its fault func picks, to see the requests a client makes or to
// make a real server slow, failing or lying. A store that reuses its
// connections opens as few as it has requests in flight at once.
type Proxy struct {
	// URL is the proxy's endpoint: http://127.0.0.1:PORT.
	URL string
	// Host is its host:port.
	Host string

	srv   *httptest.Server
	mu    sync.Mutex
	reqs  []Request                   // GUARDED_BY(mu)
	conns int                         // GUARDED_BY(mu)
	fault func(r *http.Request) Fault // GUARDED_BY(mu)
}

// Request is one request the proxy received, as the client sent it.
type Request struct {
	Method, Path, Query string
	Header              http.Header
	// Range is the Range or x-ms-range header ("" for none): a ranged read.
	Range string
	// IfMatch is the If-Match header: an Azure or S3 read's pin (a GCS
	// read's is its generation= query).
	IfMatch string
}

// Fault is what the proxy does to one request. The zero Fault forwards it.
type Fault struct {
	// Status, if set, answers the request with this status and an XML
	// error body (as S3 and Azure write one) instead of forwarding it.
	Status int
	// Code is the error body's code (default InternalError; S3's
	// throttling is SlowDown).
	Code string
	// Delay holds the request this long before forwarding it (or
	// answering Status).
	Delay time.Duration
	// Rate, if set, sends the response body at this many bytes per second.
	Rate int
	// Cut forwards the response's headers and the first half of its body
	// (by its Content-Length: none without one), then cuts the connection.
	Cut bool
}

// ProxyOptions configure StartProxy.
type ProxyOptions struct {
	// TargetHost forwards each request with the target's Host header
	// (fake-gcs-server tells its XML API by it) instead of the client's
	// (which an S3 signature covers).
	TargetHost bool
}

// StartProxy starts a proxy to target (http://HOST:PORT, a path ignored),
// closed at the end of the test.
func StartProxy(t testing.TB, target string, o ProxyOptions) *Proxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = ""
	p := &Proxy{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1 // bodies as they come: a trickled body reaches the client as it trickles
	direct := rp.Director
	rp.Director = func(r *http.Request) {
		direct(r)
		if o.TargetHost {
			r.Host = u.Host
		}
	}
	// A client that gives up (a deadline) is no failure of the test.
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) { w.WriteHeader(http.StatusBadGateway) }
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rg := r.Header.Get("Range")
		if rg == "" {
			rg = r.Header.Get("X-Ms-Range")
		}
		p.mu.Lock()
		p.reqs = append(p.reqs, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(),
			Range: rg, IfMatch: r.Header.Get("If-Match")})
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
			if f.Code == "" {
				f.Code = "InternalError"
			}
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(f.Status)
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected %d</Message></Error>`, f.Code, f.Status)
			return
		}
		if f.Cut {
			w = &cutting{ResponseWriter: w}
		}
		if f.Rate > 0 {
			w = &throttled{ResponseWriter: w, rate: f.Rate}
		}
		rp.ServeHTTP(w, r)
		if f.Cut {
			panic(http.ErrAbortHandler) // a body shorter than its half, or none
		}
	}))
	p.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			p.mu.Lock()
			p.conns++
			p.mu.Unlock()
		}
	}
	p.srv.Start()
	t.Cleanup(p.srv.Close)
	p.URL = p.srv.URL
	p.Host = p.srv.Listener.Addr().String()
	return p
}

// SetFault sets what the proxy does to each request from now on (nil:
// forward every one). f runs under the proxy's lock, one request at a
// time, and may edit r: the request is forwarded as f leaves it (a header
// dropped, a query rewritten), and recorded as the client sent it.
func (p *Proxy) SetFault(f func(r *http.Request) Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault = f
}

// Requests are the requests received so far.
func (p *Proxy) Requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Request(nil), p.reqs...)
}

// Conns is how many connections clients opened to the proxy so far.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns
}

// Reset forgets the requests and connections so far.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reqs, p.conns = nil, 0
}

// Close stops the proxy: connections to it are then refused, as to a
// server that is gone, while the server behind it goes on serving others.
func (p *Proxy) Close() { p.srv.Close() }

// cutting writes the first half of a response body, then aborts the
// connection (the server recovers http.ErrAbortHandler in silence).
type cutting struct {
	http.ResponseWriter
	left int64 // bytes still to write
}

func (w *cutting) WriteHeader(code int) {
	n, _ := strconv.ParseInt(w.Header().Get("Content-Length"), 10, 64)
	w.left = n / 2
	w.ResponseWriter.WriteHeader(code)
}

func (w *cutting) Write(b []byte) (int, error) {
	if int64(len(b)) < w.left {
		w.left -= int64(len(b))
		return w.ResponseWriter.Write(b)
	}
	w.ResponseWriter.Write(b[:w.left])
	w.Flush()
	panic(http.ErrAbortHandler)
}

func (w *cutting) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
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
