package objstore

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A tree keeps at most maxWindows windows, dropping the least recently
// used; a failed fetch is returned and not kept.
func TestWindowsBounded(t *testing.T) {
	ws := newWindows()
	fetches := map[string]int{}
	get := func(key string) []byte {
		data, err := ws.get(key, func() ([]byte, error) {
			fetches[key]++
			return []byte(key), nil
		})
		require.NoError(t, err)
		require.Equal(t, key, string(data))
		return data
	}
	for i := range maxWindows {
		get(fmt.Sprint(i))
	}
	get("0") // now the most recent: "1" is the oldest
	get("new")
	assert.Equal(t, maxWindows, ws.cache.Len())
	get("0")
	assert.Equal(t, 1, fetches["0"], "kept: used recently")
	get("1")
	assert.Equal(t, 2, fetches["1"], "dropped: least recently used")

	boom := errors.New("boom")
	_, err := ws.get("bad", func() ([]byte, error) { return nil, boom })
	require.ErrorIs(t, err, boom)
	get("bad")
	assert.Equal(t, 1, fetches["bad"])
}
