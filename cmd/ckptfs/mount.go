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
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ckptfs/ckptfs/cache"
	"github.com/ckptfs/ckptfs/internal/memlimit"
	"github.com/ckptfs/ckptfs/layout/source/open"
	"github.com/ckptfs/ckptfs/vfs"
	"github.com/ckptfs/ckptfs/vfs/metrics"
	"github.com/ckptfs/ckptfs/vfs/readpath"
	"github.com/ckptfs/ckptfs/vfs/viewcache"
)

// unmountGrace is how long an unmount waits for requests in flight before
// the source's are ended (see unmountOnSignal).
const unmountGrace = 2 * time.Second

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
	fetchAhead  bool
	asyncDIO    bool
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
	fs.Var(f.blockSize, "block-size", fmt.Sprintf("cache block size: the unit shards are read in (object store sources: %s, half that with a cache under 8 blocks)", human(readpath.ObjectStoreBlockSize)))
	fs.IntVar(&f.prefetch, "prefetch", cache.DefaultReadAhead, fmt.Sprintf("`N` blocks read ahead on sequential access (0 disables; object store sources: %d, on 4 workers a core (8 to 32), fewer in a small cache)", readpath.ObjectStorePrefetch))
	fs.BoolVar(&f.prefill, "prefill", false, "once a loader reads a view file's tensors, stream the file into the page cache ahead of its page faults, while memory allows (off by default: no clear gain measured, see BENCHMARKS.md)")
	fs.BoolVar(&f.fetchAhead, "fetch-ahead", true, "object store sources: a shard object read in order is one streamed request per 64 MiB (an eighth of --cache-size), its body kept for the reads that follow within a quarter of --cache-size; =false: each block's ranges are their own requests")
	fs.BoolVar(&f.asyncDIO, "async-dio", false, "send an O_DIRECT read's FUSE requests all at once (FUSE_ASYNC_DIO), as Run:ai Model Streamer's reads want; such a read can then not be interrupted, so the default is on for a local source and off for an object store, whose stalled reads end at an interrupt (see README)")
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
	if !remote && f.flags.Changed("fetch-ahead") {
		return &usageError{fmt.Errorf("--fetch-ahead is for object store sources (s3://, gs://, az://); %s is a local directory", src)}
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
	// interruptRequests those in flight and every lookup after (Store.Drain),
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
	described := readpath.Source{Remote: remote, Cache: copts, BlockSizeGiven: f.source.changed("block-size"),
		ReadAheadGiven: f.source.changed("prefetch"), FetchAhead: f.fetchAhead, Budget: f.source.limits().Budget}
	if f.flags.Changed("async-dio") {
		described.AsyncDIO = &f.asyncDIO
	}
	policy := readpath.For(described)
	copts = policy.Cache
	sopts := f.source.options(copts.BlockSize)
	sopts.SetAhead(policy.MinRequest, policy.AheadMemory)
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
		vopts.ReadDeadline = policy.ReadDeadline
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
	// policy: proportional collection (GOGC) is off unless the user sets
	// GOGC, except while a checkpoint is opened (memlimit.Opening: its
	// garbage otherwise stayed until the limit).
	memlimit.Set(policy.MemoryLimit(c.Bound(), f.metaBudget.Int64()))
	memlimit.Buffers(c.Held) // blocks: no margin over them for the collector
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
		AllowOther: f.allowOther, Debug: f.fuseDebug, Options: o.kernel, FsName: src, AsyncDIO: policy.AsyncDIO}
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

// dirArgs completes positional arguments with directories.
func dirArgs(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return nil, cobra.ShellCompDirectiveFilterDirs
}

func completeDirs(cmd *cobra.Command, flags ...string) {
	for _, name := range flags {
		cmd.MarkFlagDirname(name)
	}
}
