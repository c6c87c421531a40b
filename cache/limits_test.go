package cache

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNewRefusesWhatItCannotHold: options that would size ristretto's
// counters or the read-ahead queue beyond memory are an error, not an
// allocation (issue 22: block size 1 made 5×10⁹ counters).
func TestNewRefusesWhatItCannotHold(t *testing.T) {
	for _, o := range []Options{
		{Size: DefaultSize, BlockSize: 1},
		{Size: MaxBlocks*testBS + testBS, BlockSize: testBS},
		{BlockSize: testBS, ReadAhead: 1<<31 - 1},
		{BlockSize: testBS, ReadAhead: MaxReadAhead + 1},
	} {
		_, err := New(o)
		require.Error(t, err, "%+v", o)
	}
	c, err := New(Options{Size: MaxBlocks * testBS, BlockSize: testBS, ReadAhead: MaxReadAhead})
	require.NoError(t, err)
	c.Close()
}
