//go:build linux

package hugepage

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Advise advises the whole huge pages inside b MADV_HUGEPAGE and returns
// how many bytes it advised (0 when b covers none, or the kernel refused).
// Call it before b's first touch: pages already faulted in stay 4 KiB until
// khugepaged collapses them, if ever.
func Advise(b []byte) int {
	if len(b) < Size {
		return 0
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo, hi := interior(base, uintptr(len(b)))
	if hi <= lo {
		return 0
	}
	if unix.Madvise(b[lo-base:hi-base], unix.MADV_HUGEPAGE) != nil {
		return 0 // e.g. a kernel without THP: a hint, not a need
	}
	return int(hi - lo)
}
