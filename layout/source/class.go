package source

import "errors"

// What a failed call says of a remote store, as its store package tells it
// from the SDK's error (layout/source/objstore's classes): whether the store
// answered at all. Only a store that does not answer is an outage, which
// fails other names' calls for a while (vfs); a refusal is an answer about
// the name asked.
var (
	// ErrUnavailable: the store did not answer: a request past its
	// deadline, a 5xx or throttling, a connection refused or cut, retries
	// of those exhausted.
	ErrUnavailable = errors.New("the store did not answer")
	// ErrDenied: the store refused the request's credentials (401, 403).
	ErrDenied = errors.New("the store denied access")
)

// IsUnavailable reports whether err says the store did not answer.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }
