package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ckptfs/ckptfs/cache"
	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/layout/source/open"
	"github.com/ckptfs/ckptfs/vfs"
	"github.com/ckptfs/ckptfs/vfs/metrics"
	"github.com/ckptfs/ckptfs/vfs/viewcache"
)

// unmountGrace is how long an unmount waits for requests in flight before
// the source's are ended (see unmountOnSignal).
const unmountGrace = 2 * time.Second

// memoryHeadroom is what the mount process may use beyond its block cache:
// blocks in flight, FUSE buffers, parsed metadata.
const memoryHeadroom = 48 << 20

// mountFlags are the flags of the mount command; each is also a -o option.
type mountFlags struct {
	view        viewFlags
	source      sourceFlags
	write       writeFlags
	owner       ownerFlags
	cacheSize   *byteSize
	metaBudget  *byteSize
	blockSize   *byteSize
	readAhead   *byteSize
	prefetch    int
	prefill     bool
	directReads bool
	allowOther  bool
	nonEmpty    bool
	fuseDebug   bool
	verbose     bool
	quiet       bool
	logLevel    string
	metricsAddr string
	logFormat   string
	logFile     string
	options     []string // -o, applied onto the flags above by applyOptions
	flags       *pflag.FlagSet
}

func (f *mountFlags) register(fs *pflag.FlagSet) {
	f.flags = fs
	f.view.register(fs)
	f.source.register(fs, true)
	f.owner.register(fs)
	f.cacheSize = newByteSize(cache.DefaultSize, false)
	f.blockSize = newByteSize(cache.DefaultBlockSize, false)
	f.metaBudget = newByteSize(viewcache.DefaultMetadataBudget, false)
	f.readAhead = newByteSize(vfs.DefaultReadAhead, true)
	fs.Var(f.cacheSize, "cache-size", "block cache size (memory), for object store sources, --prefill and --direct-reads=false; peak RSS stays near this plus the open views' metadata (at most --metadata-budget) plus ~64 MiB")
	fs.Var(f.metaBudget, "metadata-budget", "memory for the open views' metadata (chunk indexes): least recently used views are closed beyond it (see README, Memory)")
	fs.Var(f.blockSize, "block-size", fmt.Sprintf("cache block size: the unit shards are read in (object store sources: %s, half that with a cache under 8 blocks)", human(s3BlockSize)))
	fs.IntVar(&f.prefetch, "prefetch", cache.DefaultReadAhead, fmt.Sprintf("`N` blocks read ahead on sequential access (0 disables; object store sources: %d on %d workers, fewer in a small cache)", s3Prefetch, s3Workers))
	fs.BoolVar(&f.prefill, "prefill", false, "once a loader reads a view file's tensors, stream the file into the page cache ahead of its page faults, while memory allows (off by default: no clear gain measured, see BENCHMARKS.md)")
	fs.BoolVar(&f.directReads, "direct-reads", true, "read view files of a local source straight from the shards into each reply; =false reads them through the block cache, as object store sources always are (see README)")
	fs.Var(f.readAhead, "read-ahead", "kernel read-ahead of the mount (read_ahead_kb, set when root; 0 leaves the kernel default): unless given, the disk's under SRC, so that the view is read as a copy there would be; the default below where SRC is on no disk (tmpfs, s3://)")
	fs.BoolVar(&f.allowOther, "allow-other", false, "let other users access the mount")
	fs.BoolVar(&f.nonEmpty, "allow-non-empty", false, "mount over a directory that has files, hiding them (-o nonempty too)")
	fs.BoolVar(&f.fuseDebug, "debug", false, "log every FUSE request (debug records: sets --log-level debug)")
	fs.BoolVarP(&f.verbose, "verbose", "v", false, "log debug messages too (= --log-level debug)")
	fs.BoolVarP(&f.quiet, "quiet", "q", false, "log warnings and errors only (= --log-level warn)")
	fs.StringVar(&f.logLevel, "log-level", "info", "least `LEVEL` logged: debug, info, warn or error")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://`HOST:PORT`/metrics (the counters of .ckptfs, fill and commit latencies)")
	fs.StringVar(&f.logFormat, "log-format", "text", "log `FORMAT`: text or json")
	fs.StringVar(&f.logFile, "log-file", "", "append logs to `FILE` instead of stderr (a mount started by mount(8) has no stderr)")
	f.write.register(fs)
	fs.StringArrayVarP(&f.options, "option", "o", nil, "mount `OPTIONS` as in fstab, comma-separated: any flag of this command with _ or - (cache_size=1GiB,allow_other),\nwritable (= --rw), ro, foreground, and the standard ones (see README)")
}

func newMountCmd(helper *[]string) *cobra.Command {
	var f mountFlags
	cmd := &cobra.Command{
		Use:   "mount [flags] SRC MNT",
		Short: "Mount SRC at MNT: every checkpoint under SRC appears as an HF directory",
		Long: `Mount SRC at MNT, read-only. Every checkpoint directory under SRC (DCP, HF-sharded
safetensors, Megatron torch_dist, pipeline stages, plain HF) appears at the same relative
path as an HF model directory, with HF names where a built-in mapping knows the framework
(Megatron-Core GPT, torchtitan, KempnerForge); other files and folders show through. Runs in the foreground; Ctrl-C or
SIGTERM unmounts. From another shell: ckptfs umount MNT (or fusermount3 -u MNT).
Under systemd (Type=notify) it reports READY=1 once the mount answers.

With --rw, a directory created in the mount (mkdir, save_pretrained) is a write
target: each *.safetensors file closed there is resharded into a DCP checkpoint
(laid out by --world-size, --plan, --like, --prefix); close() fails with EIO and
nothing is committed when it cannot be. Other files are stored as-is. Existing
checkpoints stay read-only.`,
		Args: positional("SRC", "MNT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := applyOptions(cmd.Flags(), f.options)
			if err != nil {
				return &usageError{err}
			}
			if err := checkLimits(cmd.Flags()); err != nil {
				return err
			}
			if *helper != nil && !opts.foreground && !isDaemonChild() {
				return daemonize(*helper)
			}
			return runMount(cmd.ErrOrStderr(), args[0], args[1], &f, opts)
		},
	}
	f.register(cmd.Flags())
	completeDirs(cmd, "like", "hf-config")
	cmd.ValidArgsFunction = dirArgs
	cmd.RegisterFlagCompletionFunc("log-format", cobra.FixedCompletions([]string{"text", "json"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// runMount serves the mount until it is unmounted or signalled.
func runMount(stderr io.Writer, src, mnt string, f *mountFlags, o mountOptions) (err error) {
	ready := takeReadiness()
	defer func() {
		if err != nil {
			ready.failed(err)
		}
	}()
	level, err := f.level()
	if err != nil {
		return err
	}
	log, logFile, err := newLogger(stderr, f.logFile, f.logFormat, level)
	if err != nil {
		return err
	}
	defer logFile.Close()
	if logFile != nil {
		// A mount started by mount(8) has no stderr to read its error on.
		defer func() {
			if err != nil {
				log.Error("mount failed", "err", err)
			}
		}()
	}
	// go-fuse logs a few problems through the log package's default logger.
	stdlog.SetFlags(0)
	stdlog.SetOutput(vfs.StdLogger(log, slog.LevelWarn).Writer())
	defer stdlog.SetOutput(os.Stderr)
	ready.log = log
	if err := f.source.check(src); err != nil {
		return err
	}
	remote := open.IsRemote(src)
	if remote && f.write.rw {
		return &usageError{fmt.Errorf("--rw: %s cannot be mounted writable: written checkpoints need a local directory", src)}
	}
	target, err := f.write.target()
	if err != nil {
		return err
	}
	objects, err := f.owner.objects(remote)
	if err != nil {
		return err
	}
	// Signals are caught from the start: one that arrived while the mount
	// was coming up, under the default action, would kill the process while
	// a thread of it waits on its own mount (the readiness stat), a wait the
	// kernel cannot end, leaving an unkillable zombie.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer func() { signal.Stop(hup); close(hup) }()
	go reopenOnHangup(hup, logFile, log)
	if err := checkMountpoint(mnt, f.nonEmpty); err != nil {
		return err
	}
	if !f.write.rw && !slices.Contains(o.kernel, "ro") {
		o.kernel = append(o.kernel, "ro") // mountinfo says what the mount is
	}
	if real, err := filepath.EvalSymlinks(mnt); err == nil {
		mnt = real // as mountinfo will name it, for the watchdog
	}

	// cancelRequests ends the store's requests for good, once unmounted;
	// interruptRequests those in flight and every lookup after (s3.Drain),
	// which an unmount would wait on.
	cancelRequests, interruptRequests := func() {}, func() {}
	copts := cache.Options{Size: f.cacheSize.Int64(), BlockSize: f.blockSize.Int64(), ReadAhead: f.prefetch}
	vopts := vfs.Options{Plan: f.view.options(), Logger: log, Writable: f.write.rw, Target: target, Prefill: f.prefill,
		DirectReads: f.directReads, Objects: objects, StatsMode: f.owner.stats(), MetadataBudget: f.metaBudget.Int64()}
	var m *metrics.Metrics
	if f.metricsAddr != "" {
		m = metrics.New()
		m.Build(buildInfo())
		copts.FillObserver, vopts.CommitObserver = m.ObserveFill, m.ObserveCommit
		f.source.observeRequest = m.ObserveRequest
	}
	if remote {
		// Each block is a request: bigger blocks, several in flight.
		var given int64
		if f.source.changed("block-size") {
			given = copts.BlockSize
		}
		block, prefetch, workers := s3CacheDefaults(copts.Size, given)
		copts.BlockSize = block
		if !f.source.changed("prefetch") {
			copts.ReadAhead = prefetch
		}
		copts.Workers = workers
	}
	sopts := f.source.options(copts.BlockSize)
	sopts.Writable = f.write.rw
	source, err := open.Open(context.Background(), src, "", sopts)
	if err != nil {
		return err
	}
	defer source.Close() // after the vfs is closed
	if vopts.Tree, err = source.Dir(); err != nil {
		return err
	}
	if source.Store != nil {
		// One deadline per read: what one block's request may take, its
		// retries included; a read waits for at most two blocks.
		vopts.ReadDeadline = f.source.s3Options().Budget(copts.BlockSize)
		cancelRequests = func() { source.Close() }
		interruptRequests = source.Store.Drain
	}
	c, err := cache.New(copts)
	if err != nil {
		return err
	}
	// The cache's blocks (cached, staged and being filled, all within
	// Bound) are nearly all of the live heap: a soft limit above them by the
	// headroom makes the GC return evicted blocks before the heap doubles
	// (GOGC), and never sits below the live heap (which made it run
	// constantly when fills in flight were not bounded). That limit is the
	// whole policy: proportional collection (GOGC) is off unless the user
	// sets GOGC, since while the cache is still empty it collected every
	// few MiB of a large .metadata's decode (a quarter of the profile of
	// opening 100k chunks) to keep a heap far below the limit.
	debug.SetMemoryLimit(memoryLimit(c.Bound(), f.metaBudget.Int64()))
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(-1)
	}
	defer c.Close()
	vopts.Cache = c
	fsys, err := vfs.New(vopts)
	if err != nil {
		return err
	}
	defer fsys.Close()
	if m != nil {
		m.Watch(fsys.Stats)
		stop, err := serveMetrics(f.metricsAddr, m, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	readAhead := f.readAhead.Int64()
	if !remote && !f.flags.Changed("read-ahead") {
		if ra, ok := vfs.SourceReadAhead(src); ok {
			readAhead = ra
		}
	}
	// Logged before the mount appears, so whoever waits for the mount sees it.
	attrs := []any{"source", src, "mountpoint", mnt, "mode", f.write.describe(), "cache", human(f.cacheSize.Int64()),
		"read_ahead", human(readAhead)}
	if f.metricsAddr != "" {
		attrs = append(attrs, "metrics", "http://"+f.metricsAddr+"/metrics")
	}
	log.Info("mounting", attrs...)
	mo := vfs.MountOptions{ReadAheadKB: int(readAhead >> 10),
		AllowOther: f.allowOther, Debug: f.fuseDebug, Options: o.kernel, FsName: src}
	if m != nil {
		mo.ObserveOp = m.ObserveOp
	}
	server, err := vfs.Mount(mnt, fsys, mo)
	if err != nil {
		return err
	}
	// Mounted: from here every way out ends the mount, and the watchdog
	// ends it (this one only) if the process dies first. A mount missing
	// from this process's mountinfo is served without a watchdog, as when
	// the watchdog cannot start: under the tests' concurrent mounts a mount
	// has, rarely, stayed out of its own process's mountinfo while other
	// processes listed and used it, and failing it took down a mount that
	// worked.
	wd := &watchdog{}
	if own, err := findOwnMount(mnt); err != nil {
		log.Warn("no unmount watchdog", "err", err)
	} else {
		wd = startWatchdog(mnt, own, log)
	}
	defer wd.close()
	// vfs.Mount returns once go-fuse has opened a file through mnt: the
	// mount answers, and readiness can be reported. (A stat of mnt here,
	// waiting for the root to change, was seen under concurrent test mounts
	// to find the directory under the mount for 30 s while other processes
	// used the mount.)
	var signalled atomic.Bool
	defer unmountOnSignal(sigs, server, mnt, log, ready, interruptRequests, &signalled)()
	ready.ready()
	server.Wait()
	wd.disarm()
	logUnmounted(log, mnt, signalled.Load())
	ready.stopping()
	// Unmounted: nobody waits for what is still being fetched (read-ahead),
	// and the cache's Close waits for its workers, so end their requests now
	// rather than after a stalled store's timeouts.
	cancelRequests()
	return nil
}

// unmountOnSignal unmounts on the signals sigs receives (SIGINT, SIGTERM)
// until stop is called. A busy mount (files open or mapped) is
// detached and served until its files close, unless a second signal asks to
// exit now. unmountGrace after the signal, the requests still waiting on
// the source (a lookup or read ahead stuck on a stalled object store) are
// ended with interrupt: they would keep the unmount waiting, or a detached
// mount busy, for as long as the store does not answer. Files that stay
// open are served on.
func unmountOnSignal(sigs chan os.Signal, server *fuse.Server, mnt string, log *slog.Logger, ready *readiness, interrupt func(), signalled *atomic.Bool) (stop func()) {
	go func() {
		s, ok := <-sigs
		if !ok {
			return
		}
		signalled.Store(true)
		log.Info("unmounting", "signal", s.String())
		ready.stopping()
		stalled := time.AfterFunc(unmountGrace, interrupt)
		if server.Unmount() == nil {
			stalled.Stop()
			return
		}
		log.Warn("busy: detached, serving open files until they close (signal again to exit now)", "mountpoint", mnt)
		syscall.Unmount(mnt, syscall.MNT_DETACH)
		if _, ok := <-sigs; !ok {
			return // the last file closed: the mount is returning
		}
		log.Error("exiting with files still open", "mountpoint", mnt)
		os.Exit(1)
	}()
	return func() {
		signal.Stop(sigs)
		close(sigs) // ends the goroutine; no signal is sent after Stop
	}
}

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

// checkMountpoint refuses a mount point that is no directory, or one with
// files or a mount on it unless nonEmpty, before anything is mounted on it (a FUSE mount on a
// regular file succeeds, and then nothing can use it).
func checkMountpoint(mnt string, nonEmpty bool) error {
	if !nonEmpty {
		if err := checkNotMounted(mnt); err != nil {
			return err
		}
	}
	fi, err := os.Stat(mnt)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("mount point %s is not a directory", mnt)
	}
	if !nonEmpty {
		d, err := os.Open(mnt)
		if err != nil {
			return err
		}
		names, _ := d.Readdirnames(1)
		d.Close()
		if len(names) > 0 {
			return fmt.Errorf("mount point %s is not empty (--allow-non-empty, -o nonempty, to mount over its files)", mnt)
		}
	}
	return nil
}

// serveMetrics serves m at addr until stop is called. The address is bound
// before the mount, so a taken port fails the mount instead of a log line.
func serveMetrics(addr string, m *metrics.Metrics, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "addr", addr, "err", err)
		}
	}()
	return func() { srv.Close() }, nil
}

// writeFlags choose whether a mount is writable and the layout written.
type writeFlags struct {
	rw        bool
	worldSize int
	plan      string
	like      string
	prefix    string
}

func (w *writeFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&w.rw, "rw", false, "writable mount: directories created in it become DCP checkpoints of the safetensors written into them")
	fs.IntVar(&w.worldSize, "world-size", 1, "with --rw: `N` ranks in the written checkpoint; tensors are sharded on dim 0 as FSDP2 does unless --plan or --like says otherwise")
	fs.StringVar(&w.plan, "plan", "", "with --rw: per-tensor placement `FILE`, one \"REGEX DIM\" or \"REGEX replicate\" per line, first match wins (e.g. 'q_proj 0', 'o_proj 1', 'norm replicate')")
	fs.StringVar(&w.like, "like", "", "with --rw: reuse the chunk layout of the checkpoint in `DIR` for the tensors it has")
	fs.StringVar(&w.prefix, "prefix", "", "with --rw: store tensors under `KEY` (e.g. model, as dcp.save of {\"model\": state_dict} does)")
}

// target builds the write layout, checking the flags.
func (w *writeFlags) target() (dcpwrite.Target, error) {
	t := dcpwrite.Target{WorldSize: w.worldSize, Prefix: strings.Trim(w.prefix, ".")}
	if !w.rw {
		if w.worldSize != 1 || w.plan != "" || w.like != "" || w.prefix != "" {
			return t, errors.New("--world-size, --plan, --like and --prefix need --rw")
		}
		return t, nil
	}
	if w.worldSize < 1 {
		return t, fmt.Errorf("--world-size %d: want 1 or more", w.worldSize)
	}
	if w.plan != "" {
		f, err := os.Open(w.plan)
		if err != nil {
			return t, err
		}
		defer f.Close()
		if t.Rules, err = dcpwrite.ParseRules(f); err != nil {
			return t, fmt.Errorf("--plan %s: %w", w.plan, err)
		}
	}
	if w.like != "" {
		c, err := layout.Open(w.like)
		if err != nil {
			return t, fmt.Errorf("--like: %w", err)
		}
		c.Close() // only the chunk boxes are used
		t.Like = c
	}
	return t, nil
}

func (w *writeFlags) describe() string {
	if !w.rw {
		return "read-only"
	}
	s := fmt.Sprintf("read-write: new directories become DCP checkpoints, world size %d", w.worldSize)
	if w.plan != "" {
		s += ", plan " + w.plan
	}
	if w.like != "" {
		s += ", like " + w.like
	}
	if w.prefix != "" {
		s += ", prefix " + w.prefix
	}
	return s
}

func newUmountCmd() *cobra.Command {
	var lazy bool
	cmd := &cobra.Command{
		Use:   "umount [flags] MNT",
		Short: "Unmount a ckptfs mount (the serving process then exits)",
		Args:  positional("MNT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			mnt := args[0]
			// As umount(8) -t fuse.ckptfs would: never another filesystem.
			if _, err := findCkptfsMount(mnt); err != nil {
				return err
			}
			if lazy {
				return lazyUnmount(mnt)
			}
			err := unmountRetrying(mnt)
			if err != nil && !errors.Is(err, syscall.EBUSY) {
				if out, ferr := exec.Command("fusermount3", "-u", mnt).CombinedOutput(); ferr != nil {
					return fmt.Errorf("unmount %s: %v; fusermount3: %s", mnt, err, out)
				}
				err = nil
			}
			if err != nil {
				return fmt.Errorf("unmount %s: %w (files open under it; --lazy detaches it now)", mnt, err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&lazy, "lazy", false, "detach now even if files are open")
	cmd.ValidArgsFunction = dirArgs
	return cmd
}

// busyFor is how long an unmount retries a mount found busy. The kernel
// holds a FUSE mount busy until the server has answered the RELEASE of
// every file closed on it, which it sends after close(2) returns: an
// unmount right after a reader closed (or right after mounting, whose
// readiness check opens a file) can find it busy for a moment.
const busyFor = 2 * time.Second

// unmountRetrying unmounts mnt, retrying for up to busyFor while it is
// busy.
func unmountRetrying(mnt string) error {
	deadline := time.Now().Add(busyFor)
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 200*time.Millisecond) {
		err := syscall.Unmount(mnt, 0)
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(delay)
	}
}

// dirArgs completes positional arguments with directories.
func dirArgs(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return nil, cobra.ShellCompDirectiveFilterDirs
}

func completeDirs(cmd *cobra.Command, flags ...string) {
	for _, name := range flags {
		cmd.MarkFlagDirname(name)
	}
}
