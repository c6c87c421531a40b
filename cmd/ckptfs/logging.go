package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
)

// level is the least level logged, as --log-level, -v, -q and --debug say:
// one of them, or --debug with the level it needs.
func (f *mountFlags) level() (slog.Level, error) {
	var given []string
	for _, name := range []string{"log-level", "verbose", "quiet"} {
		if f.source.changed(name) {
			given = append(given, "--"+name)
		}
	}
	if len(given) > 1 {
		return 0, &usageError{fmt.Errorf("%s contradict each other: give one", strings.Join(given, " and "))}
	}
	name := f.logLevel
	switch {
	case f.verbose:
		name = "debug"
	case f.quiet:
		name = "warn"
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(name)); err != nil || strings.ContainsAny(name, "+-") {
		return 0, &usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", name)}
	}
	if f.fuseDebug {
		if level > slog.LevelDebug && len(given) > 0 {
			return 0, &usageError{fmt.Errorf("--debug logs its traces at level debug; %s hides them", given[0])}
		}
		level = slog.LevelDebug
	}
	return level, nil
}

// newLogger returns the mount's logger: text or JSON, to the file at path
// if set (then returned, to reopen and close; a nil *logFile is stderr).
func newLogger(stderr io.Writer, path, format string, level slog.Level) (*slog.Logger, *logFile, error) {
	w := stderr
	var lf *logFile
	if path != "" {
		var err error
		if lf, err = openLogFile(path); err != nil {
			return nil, nil, fmt.Errorf("--log-file: %w", err)
		}
		w = lf
	}
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), lf, nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), lf, nil
	}
	lf.Close()
	return nil, nil, &usageError{fmt.Errorf("--log-format %q: want text or json", format)}
}

// logFile is --log-file, reopened on SIGHUP so that logrotate can move it
// away and the mount goes on logging to a new file of that name.
type logFile struct {
	path string
	mu   sync.Mutex
	f    *os.File // GUARDED_BY(mu); nil once closed
}

func openLogFile(path string) (*logFile, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &logFile{path: path, f: f}, nil
}

func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return 0, os.ErrClosed
	}
	return l.f.Write(p)
}

// reopen opens the path again; on failure the old file stays in use.
func (l *logFile) reopen() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return os.ErrClosed
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	l.f.Close()
	l.f = f
	return nil
}

func (l *logFile) Close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

// reopenOnHangup reopens the log file on each SIGHUP until hup is closed
// (a mount logging to stderr ignores SIGHUP: it no longer unmounts).
func reopenOnHangup(hup <-chan os.Signal, lf *logFile, log *slog.Logger) {
	for range hup {
		if lf == nil {
			continue
		}
		if err := lf.reopen(); err != nil {
			log.Error("--log-file not reopened", "path", lf.path, "err", err)
			continue
		}
		log.Info("log file reopened", "path", lf.path)
	}
}
