package main

import (
	"log/slog"
)

// logUnmounted logs the end of the mount, whoever ended it: a signal
// (logged as it came) or an unmount from outside (umount, fusermount3 -u,
// ckptfs umount), which the mount only learns of as the kernel ends the
// connection.
func logUnmounted(log *slog.Logger, mnt string, signalled bool) {
	by := "unmounted from outside (umount, fusermount3 -u or ckptfs umount)"
	if signalled {
		by = "signal"
	}
	log.Info("unmounted", "mountpoint", mnt, "by", by)
}
