//go:build linux

package hugepage

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// advised reports whether the mapping holding addr is advised
// MADV_HUGEPAGE ("hg" in its smaps VmFlags).
func advised(t *testing.T, addr uintptr) bool {
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) > 0 && !strings.HasSuffix(f[0], ":") {
			// A mapping's first line: "lo-hi perms offset dev inode path".
			var lo, hi uintptr
			_, err := fmt.Sscanf(f[0], "%x-%x", &lo, &hi)
			require.NoError(t, err, line)
			in = lo <= addr && addr < hi
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return strings.Contains(line, " hg")
		}
	}
	require.NoError(t, sc.Err())
	t.Fatalf("no mapping holds %#x", addr)
	return false
}

// TestAdviseTheInteriorOnly advises a fresh heap buffer whose both ends
// are off huge page bounds: the whole huge pages inside are advised, the
// bytes before and after them are not, and the buffer reads and writes as
// any other whichever pages the kernel gives.
func TestAdviseTheInteriorOnly(t *testing.T) {
	big := make([]byte, 16<<20)
	// Go's large objects start on 8 KiB pages: 4 KiB in is never a huge
	// page bound, nor 4 KiB before the end.
	b := big[4096 : len(big)-4096]
	base := uintptr(unsafe.Pointer(&b[0]))
	lo, hi := interior(base, uintptr(len(b)))
	require.Greater(t, hi, lo)

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before, after unix.Rusage
	require.NoError(t, unix.Getrusage(unix.RUSAGE_THREAD, &before))
	n := Advise(b)
	assert.Equal(t, int(hi-lo), n)
	assert.True(t, advised(t, lo), "the first whole huge page")
	assert.True(t, advised(t, hi-1), "the last whole huge page")
	assert.False(t, advised(t, lo-1), "the head before the first bound")
	assert.False(t, advised(t, hi), "the tail past the last bound")

	for i := range b {
		b[i] = byte(i)
	}
	require.NoError(t, unix.Getrusage(unix.RUSAGE_THREAD, &after))
	for i := 0; i < len(b); i += 4093 {
		require.Equal(t, byte(i), b[i])
	}
	mode, _ := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	// How many huge pages the kernel gave depends on what is free: logged,
	// not asserted (4 KiB pages are the fallback, not an error).
	t.Logf("THP %q: %d minor faults for %d KiB advised (%d 4 KiB pages)",
		strings.TrimSpace(string(mode)), after.Minflt-before.Minflt, n>>10, len(b)>>12)
}

func TestAdviseShortBuffers(t *testing.T) {
	assert.Equal(t, 0, Advise(nil))
	assert.Equal(t, 0, Advise(make([]byte, Size-1)))
}
