package main

import (
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

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
