//go:build !linux

package hugepage

// Advise does nothing where there is no MADV_HUGEPAGE: see the Linux one.
func Advise(b []byte) int { return 0 }
