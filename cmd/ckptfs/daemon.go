package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/coreos/go-systemd/v22/daemon"
)

// readyFDEnv names the descriptor on which a daemonised mount reports to the
// process that started it: one line, "ready" or "error: MESSAGE".
const readyFDEnv = "CKPTFS_READY_FD"

func isDaemonChild() bool { return os.Getenv(readyFDEnv) != "" }

// daemonize runs this command line again in a new session, detached from the
// caller's terminal and stdio (mount(8) waits for those to close), and
// returns once the mount answers, or with the error that stopped it. The
// child logs to --log-file, or nowhere.
func daemonize(args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("daemonize: %w", err)
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("daemonize: %w", err)
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("daemonize: %w", err)
	}
	defer r.Close()
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), readyFDEnv+"=3")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, null, null
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return fmt.Errorf("daemonize: %w", err)
	}
	report, _ := io.ReadAll(r) // until the child reports, or exits
	line := strings.TrimSpace(string(report))
	switch {
	case line == "ready":
		return cmd.Process.Release()
	case strings.HasPrefix(line, "error: "):
		cmd.Wait()
		return errors.New(strings.TrimPrefix(line, "error: "))
	}
	cmd.Wait()
	return fmt.Errorf("mount process ended before the mount was ready (%v)", cmd.ProcessState)
}

// readiness tells whoever waits for this mount when it answers, or why it
// never will: the process that daemonised it (a pipe) and systemd
// (sd_notify, for Type=notify units).
type readiness struct {
	pipe     *os.File     // nil unless daemonised
	log      *slog.Logger // where a failed sd_notify is logged, once there is a logger
	stopOnce sync.Once
}

// takeReadiness takes the report pipe of a daemonised mount, if any, out of
// the environment so that processes started later do not inherit it.
func takeReadiness() *readiness {
	r := &readiness{}
	if s := os.Getenv(readyFDEnv); s != "" {
		os.Unsetenv(readyFDEnv)
		if fd, err := strconv.Atoi(s); err == nil {
			syscall.CloseOnExec(fd)
			r.pipe = os.NewFile(uintptr(fd), "ready")
		}
	}
	return r
}

// ready reports that the mount answers.
func (r *readiness) ready() {
	r.report("ready")
	r.notify("READY=1")
}

// failed reports that the mount will never answer.
func (r *readiness) failed(err error) {
	r.report("error: " + strings.ReplaceAll(err.Error(), "\n", " "))
}

// stopping tells systemd, once, that the mount is going away.
func (r *readiness) stopping() {
	r.stopOnce.Do(func() { r.notify("STOPPING=1") })
}

func (r *readiness) notify(state string) {
	if err := sdNotify(state); err != nil && r.log != nil {
		r.log.Warn("service manager not notified", "state", state, "err", err)
	}
}

func (r *readiness) report(line string) {
	if r.pipe != nil {
		fmt.Fprintln(r.pipe, line)
		r.pipe.Close()
		r.pipe = nil
	}
}

// sdNotify sends state ("READY=1") to the service manager's socket in
// $NOTIFY_SOCKET, if set (sd_notify(3)).
func sdNotify(state string) error {
	if _, err := daemon.SdNotify(false, state); err != nil {
		return fmt.Errorf("sd_notify %s: %w", os.Getenv("NOTIFY_SOCKET"), err)
	}
	return nil
}
