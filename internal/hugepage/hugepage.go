// Package hugepage asks the kernel to back large, fresh buffers with
// transparent huge pages. A cold mount's block cache and stream pieces are
// hundreds of MiB of Go heap never touched before: in 4 KiB pages their
// first touch is one page fault per page (a cold `cat` of an s3:// view
// took ~120 k of them), where a 2 MiB page takes one. Where THP is
// "madvise" (the default of many distributions) the kernel gives huge
// pages only to ranges advised MADV_HUGEPAGE.
//
// The advice is a hint: where huge pages are off ("never"), none is free
// and compaction fails, or the platform has none, the buffer is faulted in
// 4 KiB pages as before. Nothing fails.
package hugepage

// Size is the huge page size advised for: x86-64's and arm64's (4 KiB
// base pages) PMD size.
const Size = 2 << 20

// interior returns the part [lo, hi) of [addr, addr+n) that whole huge
// pages cover: only whole, aligned huge pages can be huge, and advising a
// range that reaches outside the buffer would give pages of whatever the
// allocator put beside it the same advice. hi <= lo: none.
func interior(addr, n uintptr) (lo, hi uintptr) {
	lo = (addr + Size - 1) &^ (Size - 1)
	hi = (addr + n) &^ (Size - 1)
	if hi < lo {
		hi = lo
	}
	return lo, hi
}
