package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/ckptfs/ckptfs/cache"
	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/vfs"
)

const watchdogCmd = "__unmount-on-exit"

// memoryHeadroom is what the mount process may use beyond its block cache:
// blocks in flight, FUSE buffers, parsed metadata.
const memoryHeadroom = 48 << 20

func runMount(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("mount", "SRC MNT", `Mount SRC at MNT, read-only. Every checkpoint directory under SRC (DCP, HF-sharded
safetensors, Megatron torch_dist) appears at the same relative path as an HF model
directory; other files and folders show through. Runs in the foreground; Ctrl-C or
SIGTERM unmounts. From another shell: ckptfs umount MNT (or fusermount3 -u MNT).

With --rw, a directory created in the mount (mkdir, save_pretrained) is a write
target: each *.safetensors file closed there is resharded into a DCP checkpoint
(laid out by --world-size, --plan, --like, --prefix); close() fails with EIO and
nothing is committed when it cannot be. Other files are stored as-is. Existing
checkpoints stay read-only.`, stderr)
	var vf viewFlags
	vf.register(fs)
	cacheSize := byteSize(512 << 20)
	blockSize := byteSize(4 << 20)
	readAhead := byteSize(1 << 20)
	fs.Var(&cacheSize, "cache-size", "block cache size (memory); peak RSS stays near this plus ~64 MiB")
	fs.Var(&blockSize, "block-size", "cache block size: the unit shards are read in")
	prefetch := fs.Int("prefetch", 4, "blocks read ahead on sequential access (0 disables)")
	fs.Var(&readAhead, "read-ahead", "kernel read-ahead of the mount (read_ahead_kb, set when root; 0 leaves the kernel default)")
	allowOther := fs.Bool("allow-other", false, "let other users access the mount")
	fuseDebug := fs.Bool("debug", false, "log every FUSE request")
	verbose := fs.Bool("v", false, "verbose logging")
	var wf writeFlags
	wf.register(fs)
	pos, err := parse(fs, args, 2)
	if err != nil {
		return err
	}
	target, err := wf.target()
	if err != nil {
		return err
	}
	src, mnt := pos[0], pos[1]
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	// The cache is nearly all of the heap: a soft limit a little above it
	// makes the GC return evicted blocks before the heap doubles (GOGC).
	debug.SetMemoryLimit(int64(cacheSize) + memoryHeadroom)
	c, err := cache.New(cache.Options{Size: int64(cacheSize), BlockSize: int64(blockSize), ReadAhead: *prefetch})
	if err != nil {
		return err
	}
	defer c.Close()
	fsys, err := vfs.New(vfs.Options{Source: src, Plan: vf.options(), Cache: c, Logger: log, Writable: wf.rw, Target: target})
	if err != nil {
		return err
	}
	defer fsys.Close()
	server, err := vfs.Mount(mnt, fsys, vfs.MountOptions{ReadAheadKB: int(readAhead) >> 10, AllowOther: *allowOther, Debug: *fuseDebug})
	if err != nil {
		return err
	}
	stopWatchdog := startWatchdog(mnt, log)
	defer stopWatchdog()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		log.Info("unmounting", "signal", s.String())
		if err := server.Unmount(); err != nil {
			// Files are still open or mapped: detach now, keep serving
			// them until they are closed, unless asked again.
			fmt.Fprintf(stderr, "ckptfs: %s is busy; detached, serving open files until they close (signal again to exit now)\n", mnt)
			syscall.Unmount(mnt, syscall.MNT_DETACH)
			<-sigs
			fmt.Fprintf(stderr, "ckptfs: exiting with files still open\n")
			os.Exit(1)
		}
	}()
	fmt.Fprintf(stderr, "ckptfs: serving %s at %s (%s, cache %s)\n", src, mnt, wf.describe(), human(int64(cacheSize)))
	server.Wait()
	return nil
}

// writeFlags choose whether a mount is writable and the layout written.
type writeFlags struct {
	rw        bool
	worldSize int
	plan      string
	like      string
	prefix    string
}

func (w *writeFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&w.rw, "rw", false, "writable mount: directories created in it become DCP checkpoints of the safetensors written into them")
	fs.IntVar(&w.worldSize, "world-size", 1, "with --rw: ranks of the written checkpoint; tensors are sharded on dim 0 as FSDP2 does unless --plan or --like says otherwise")
	fs.StringVar(&w.plan, "plan", "", "with --rw: per-tensor placement file, one \"REGEX DIM\" or \"REGEX replicate\" per line, first match wins (e.g. 'q_proj 0', 'o_proj 1', 'norm replicate')")
	fs.StringVar(&w.like, "like", "", "with --rw: reuse the chunk layout of the checkpoint in this directory for the tensors it has")
	fs.StringVar(&w.prefix, "prefix", "", "with --rw: store tensors under this key (e.g. model, as dcp.save of {\"model\": state_dict} does)")
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

// startWatchdog starts a helper process that lazily unmounts mnt when this
// process dies without unmounting (SIGKILL, OOM, crash), so the mount point
// is never left wedged ("transport endpoint is not connected"). The helper
// waits for EOF on a pipe that only this process holds open.
func startWatchdog(mnt string, log *slog.Logger) func() {
	exe, err := os.Executable()
	if err != nil {
		log.Warn("no unmount watchdog", "err", err)
		return func() {}
	}
	r, w, err := os.Pipe()
	if err != nil {
		log.Warn("no unmount watchdog", "err", err)
		return func() {}
	}
	cmd := exec.Command(exe, watchdogCmd, mnt)
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		log.Warn("no unmount watchdog", "err", err)
		r.Close()
		w.Close()
		return func() {}
	}
	r.Close()
	go cmd.Wait()
	return func() { w.Close() }
}

// runWatchdog is the helper's side: block until the mounting process is gone,
// then detach the mount if it is still there.
func runWatchdog(args []string, stdout, stderr io.Writer) error {
	if len(args) != 1 {
		return errUsage
	}
	pipe := os.NewFile(3, "watchdog")
	io.Copy(io.Discard, pipe)
	return lazyUnmount(args[0])
}

func lazyUnmount(mnt string) error {
	err := syscall.Unmount(mnt, syscall.MNT_DETACH)
	if err == nil || errors.Is(err, syscall.EINVAL) {
		return nil // done, or not mounted any more
	}
	if out, ferr := exec.Command("fusermount3", "-u", "-z", mnt).CombinedOutput(); ferr != nil {
		return fmt.Errorf("unmount %s: %v; fusermount3: %s", mnt, err, out)
	}
	return nil
}

func runUmount(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("umount", "MNT", "Unmount a ckptfs mount (the serving process then exits).", stderr)
	lazy := fs.Bool("lazy", false, "detach now even if files are open")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	if *lazy {
		return lazyUnmount(pos[0])
	}
	if err := syscall.Unmount(pos[0], 0); err != nil {
		if out, ferr := exec.Command("fusermount3", "-u", pos[0]).CombinedOutput(); ferr != nil {
			return fmt.Errorf("unmount %s: %v; fusermount3: %s", pos[0], err, out)
		}
	}
	return nil
}
