package vfs

import (
	"log/slog"
	"sync"
	"syscall"
	"time"
)

// errorWindow is how often the errors of one checkpoint are logged at
// most: its first error as it comes, then one summary line per window with
// how many more there were. The kernel asks again for a page whose read
// failed, and readers retry: without a bound, one failed read logged three
// identical lines, and anyone able to rewrite one file of a checkpoint
// under a busy mount could fill the disk of --log-file.
const errorWindow = 10 * time.Second

// errorLog rate-limits error lines per key: a checkpoint's path (its
// opens and reads), a source directory (its lookups).
type errorLog struct {
	log    *slog.Logger
	window time.Duration // errorWindow; tests shorten it

	mu   sync.Mutex
	keys map[string]*errorKey // GUARDED_BY(mu)
}

type errorKey struct {
	until      time.Time   // lines before it are counted, not logged
	suppressed int64       // lines counted since the last line logged
	last       string      // the last of them, for the summary
	timer      *time.Timer // logs the summary at until; nil when none is due
}

func newErrorLog(log *slog.Logger) *errorLog {
	return &errorLog{log: log, window: errorWindow, keys: map[string]*errorKey{}}
}

// maxErrorKeys bounds the keys kept; past it, those whose window is over
// are dropped.
const maxErrorKeys = 1024

// Error logs msg with err and args at level ERROR, unless a line for key was
// logged less than a window ago: then it is counted, and summed up in one
// line (level WARN) at the end of the window.
func (l *errorLog) Error(key, msg string, err error, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	k := l.keys[key]
	if k == nil || (k.timer == nil && !now.Before(k.until)) {
		if len(l.keys) >= maxErrorKeys {
			l.dropIdle(now)
		}
		l.keys[key] = &errorKey{until: now.Add(l.window)}
		l.log.Error(msg, append(args, "err", err, "key", key)...)
		return
	}
	k.suppressed++
	k.last = msg + ": " + err.Error()
	if k.timer == nil {
		k.timer = time.AfterFunc(k.until.Sub(now), func() { l.summary(key, k) })
	}
}

// summary logs how many lines of key's were not, and starts the next window.
func (l *errorLog) summary(key string, k *errorKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.log.Warn("more errors like the one logged", "key", key, "suppressed", k.suppressed,
		"in", l.window.String(), "last", k.last)
	k.suppressed, k.last, k.timer = 0, "", nil
	k.until = time.Now().Add(l.window)
}

func (l *errorLog) dropIdle(now time.Time) {
	for key, k := range l.keys {
		if k.timer == nil && !now.Before(k.until) {
			delete(l.keys, key)
		}
	}
}

// limitedErrno is toErrno for the errors a reader can repeat at will (the
// opens and reads of one checkpoint): its lines go through f.errLog under
// key; those of an outage of the source are not logged again (outageTree).
func (f *FS) limitedErrno(key, what string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	errno, quiet := mapErr(err)
	if !quiet && !inOutage(err) { // an outage is logged as it begins and ends

		f.errLog.Error(key, what, err, "errno", errno.Error())
	}
	return errno
}
