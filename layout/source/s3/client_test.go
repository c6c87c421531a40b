package s3

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Budget is the attempts' deadlines and the backoff between them: the
// longest a request fails in, which a read waiting on it is bounded by.
func TestBudget(t *testing.T) {
	for _, c := range []struct {
		o    Options
		n    int64
		want time.Duration
	}{
		{Options{MaxAttempts: 1, ReadTimeout: time.Second, MinRate: 1 << 20}, 1 << 20, 2 * time.Second},
		{Options{MaxAttempts: 2, ReadTimeout: time.Second, MinRate: 1 << 20}, 1 << 20, 2*2*time.Second + time.Second},
		// The defaults, a 16 MiB block: 5 × (30 s + 64 s) + 1 + 2 + 4 + 8 s.
		{Options{}, 16 << 20, 5*94*time.Second + 15*time.Second},
		// Backoff is capped at 20 s a retry.
		{Options{MaxAttempts: 8, ReadTimeout: time.Second, MinRate: 1 << 30}, 0, 8*time.Second + (1+2+4+8+16+20+20)*time.Second},
	} {
		assert.Equal(t, c.want, c.o.Budget(c.n), "%+v, %d bytes", c.o, c.n)
	}
}
