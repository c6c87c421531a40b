package objstoretest

import (
	"os"
	"os/exec"
	"sync"
	"testing"
)

// Servers starts one store's server (an emulator) for tests: Start, one
// of a test's own, stopped at its end; Shared, the one that all the tests
// of a package share. An emulator takes seconds to start (Azurite), so a
// package starts it once, at the first test that asks, and each test keeps
// to buckets of its own, removed at its end; a test that kills or freezes
// its server starts its own. A shared server runs until Main stops it (or
// the test process ends).
type Servers[S interface{ Process() *Process }] struct {
	// Run starts a server by serve (Serve for a test's own, Launch for the
	// shared one, which shared tells).
	Run func(t testing.TB, serve ServeFunc, shared bool) S
	// Env points the store's standard credential chain at srv for t.
	Env func(srv S, t testing.TB)

	mu      sync.Mutex
	shared  S    // GUARDED_BY(mu)
	started bool // GUARDED_BY(mu)
}

// ServeFunc starts a server's process: Serve or Launch.
type ServeFunc func(t testing.TB, what string, cmd *exec.Cmd, url string) *Process

// Start starts a server of t's own, stopped at its end, with Env set.
func (k *Servers[S]) Start(t testing.TB) S {
	t.Helper()
	srv := k.Run(t, Serve, false)
	k.Env(srv, t)
	return srv
}

// Shared returns the package's server, started at the first call (a start
// that fails t leaves the next test to try again), with Env set for t. Its
// output is logged to t if t fails.
func (k *Servers[S]) Shared(t testing.TB) S {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.started {
		k.shared = k.Run(t, Launch, true)
		k.started = true
		sharedProcs.Lock()
		sharedProcs.all = append(sharedProcs.all, k.shared.Process())
		sharedProcs.Unlock()
	}
	p := k.shared.Process()
	t.Cleanup(func() { p.logIfFailed(t) })
	k.Env(k.shared, t)
	return k.shared
}

// sharedProcs are the processes of every shared server started.
var sharedProcs struct {
	sync.Mutex
	all []*Process // GUARDED_BY(Mutex)
}

// Main is the TestMain of a package that shares servers: it runs the
// tests, then stops the shared servers, so that none outlives them.
func Main(m *testing.M) {
	code := m.Run()
	sharedProcs.Lock()
	for _, p := range sharedProcs.all {
		p.stop()
	}
	sharedProcs.all = nil
	sharedProcs.Unlock()
	os.Exit(code)
}
