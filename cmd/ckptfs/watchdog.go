package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

const watchdogCmd = "__unmount-on-exit"

// disarmLine, written on the watchdog's pipe, says the mount was unmounted
// by its own process: nothing is left to do.
const disarmLine = "disarm"

// watchdog is the mounting process's end of the unmount watchdog.
type watchdog struct{ w *os.File }

// startWatchdog starts a helper process that ends the mount m (at mnt) when
// this process dies without unmounting it (SIGKILL, OOM, crash), so the
// mount point is never left wedged ("transport endpoint is not connected").
// The helper waits on a pipe that only this process holds open: disarm
// before exiting after a clean unmount, close (or die) otherwise.
func startWatchdog(mnt string, m mountEntry, log *slog.Logger) *watchdog {
	exe, err := os.Executable()
	if err != nil {
		log.Warn("no unmount watchdog", "err", err)
		return &watchdog{}
	}
	r, w, err := os.Pipe()
	if err != nil {
		log.Warn("no unmount watchdog", "err", err)
		return &watchdog{}
	}
	args := []string{watchdogCmd, absMountpoint(mnt), strconv.Itoa(os.Getpid()), strconv.Itoa(m.id), m.dev}
	// The connection's control files, opened now, while the connection is
	// certainly this mount's: mount IDs and device numbers are reused by
	// the next mount, the open files are not (see endMount).
	conn := openConnection(m.dev)
	defer conn.close()
	cmd := exec.Command(exe, args...)
	cmd.ExtraFiles = []*os.File{r}
	if conn.abort != nil && conn.waiting != nil {
		cmd.Args = append(cmd.Args, withControlFiles)
		cmd.ExtraFiles = append(cmd.ExtraFiles, conn.abort, conn.waiting)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		log.Warn("no unmount watchdog", "err", err)
		w.Close()
		return &watchdog{}
	}
	go cmd.Wait()
	return &watchdog{w: w}
}

// disarm tells the watchdog the mount is gone, unmounted by this process.
func (d *watchdog) disarm() {
	if d.w != nil {
		fmt.Fprintln(d.w, disarmLine)
	}
}

// close lets the watchdog act unless disarmed.
func (d *watchdog) close() {
	if d.w != nil {
		d.w.Close()
	}
}

// runWatchdog is the helper's side: block until the mounting process is
// gone without disarming it (its end of the pipe closes), or is a zombie
// whose last thread waits on its own mount (it holds the pipe open and the
// kernel can never answer it); then end that mount and no other: abort its
// FUSE connection, which ends such waits, and detach it if it is still
// what the mount point shows.
func runWatchdog(args []string) error {
	if len(args) != 4 && (len(args) != 5 || args[4] != withControlFiles) {
		return errors.New("usage: " + watchdogCmd + " MNT PID MOUNT-ID MAJ:MIN [" + withControlFiles + "]")
	}
	var conn connection
	if len(args) == 5 {
		conn = connection{abort: os.NewFile(4, "abort"), waiting: os.NewFile(5, "waiting")}
	}
	mnt, dev := args[0], args[3]
	pid, err := strconv.Atoi(args[1])
	if err != nil {
		return err
	}
	id, err := strconv.Atoi(args[2])
	if err != nil {
		return err
	}
	gone := make(chan bool, 1) // true: disarmed
	go func() {
		sc := bufio.NewScanner(os.NewFile(3, "watchdog"))
		for sc.Scan() {
			if sc.Text() == disarmLine {
				gone <- true
				return
			}
		}
		gone <- false
	}()
	for tick := time.NewTicker(time.Second); ; {
		select {
		case disarmed := <-gone:
			if disarmed {
				return nil
			}
		case <-tick.C:
			if !isZombie(pid) {
				continue
			}
		}
		break
	}
	return endMount(mnt, id, dev, conn)
}

// withControlFiles, the watchdog's last argument, says its file
// descriptors 4 and 5 are the connection's abort and waiting files.
const withControlFiles = "ctl"

// connection is the control files of a FUSE connection (fusectl): abort
// ends it; waiting reads empty once the connection is gone, whatever
// connection has its number now.
type connection struct{ abort, waiting *os.File }

// openConnection opens the control files of the connection of the mount of
// device dev (MAJ:MIN; the minor names the connection); none where they
// cannot be opened (fusectl is root's). Nothing here touches the mount
// point: stat'ing a mount whose server is dead would hang.
func openConnection(dev string) connection {
	_, minor, ok := strings.Cut(dev, ":")
	if !ok {
		return connection{}
	}
	const ctl = "/sys/fs/fuse/connections"
	if _, err := os.Stat(ctl + "/" + minor); err != nil {
		_ = syscall.Mount("fusectl", ctl, "fusectl", 0, "") // often not mounted
	}
	var c connection
	c.abort, _ = os.OpenFile(ctl+"/"+minor+"/abort", os.O_WRONLY, 0)
	c.waiting, _ = os.Open(ctl + "/" + minor + "/waiting")
	return c
}

func (c connection) close() {
	for _, f := range []*os.File{c.abort, c.waiting} {
		if f != nil {
			f.Close()
		}
	}
}

// alive reports whether the connection the files were opened for still
// exists; ok is false when there are no files to tell.
func (c connection) alive() (alive, ok bool) {
	if c.waiting == nil {
		return false, false
	}
	// Read once, from the start: the file cannot seek (no pread).
	n, err := c.waiting.Read(make([]byte, 32))
	return n > 0 && (err == nil || errors.Is(err, io.EOF)), true
}

// endMount aborts and detaches the mount of the given ID and device, if it
// is still mounted; a mount stacked on it since is left alone (its
// connection is aborted, so it no longer wedges whoever reaches it).
//
// An ID and a device number say which mount only while that mount lives:
// the kernel gives the lowest free ones to the next mount. So with the
// connection's control files (conn), the connection decides: gone, and
// nothing is done; alive, and its device cannot have been reused.
// Without them (not root), a mount made since with the same numbers would
// be taken for ours.
func endMount(mnt string, id int, dev string, conn connection) error {
	alive, known := conn.alive()
	if known && !alive {
		return nil // ended already
	}
	if !known {
		conn = openConnection(dev)
		defer conn.close()
	}
	entries, err := readMountinfo()
	if err != nil {
		return err
	}
	var ours bool
	for _, e := range entries {
		ours = ours || e.id == id && e.dev == dev
	}
	if !ours {
		return nil // unmounted already
	}
	if conn.abort != nil {
		_, _ = conn.abort.Write([]byte("1"))
	}
	if top, ok := topMount(entries, mnt); !ok || top.id != id {
		return nil
	}
	return lazyUnmount(mnt)
}

// isZombie reports whether process pid has exited but not been reaped
// (or is gone).
func isZombie(pid int) bool {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return true // gone
	}
	st, err := p.Stat()
	return err != nil || st.State == "Z"
}

// lazyUnmount detaches whatever is mounted at mnt: callers check first that
// it is the mount they mean.
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
