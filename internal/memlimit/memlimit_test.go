package memlimit

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

func limit() int64 { return debug.SetMemoryLimit(-1) }

func TestOutsideLowersTheLimitWhileHeld(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	before := limit()
	release := Outside(100 << 20)
	assert.Equal(t, before, limit(), "no bound set: the limit is left alone")
	release()

	Set(1 << 30)
	defer Set(0)
	assert.Equal(t, int64(1<<30), limit())
	a := Outside(100 << 20)
	assert.Equal(t, int64(1<<30-100<<20), limit())
	b := Outside(800 << 20)
	assert.Equal(t, int64(1<<29), limit(), "never below half the bound")
	b()
	b() // once
	assert.Equal(t, int64(1<<30-100<<20), limit())
	a()
	assert.Equal(t, int64(1<<30), limit())
}

func gcPercent() int {
	p := debug.SetGCPercent(-1)
	debug.SetGCPercent(p)
	return p
}

func TestOpeningCollectsWhileHeld(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	release := Opening()
	assert.Equal(t, -1, gcPercent(), "no bound set: the collector is left alone")
	release()

	Set(1 << 30)
	defer Set(0)
	a := Opening()
	assert.Equal(t, openingGC, gcPercent())
	b := Opening()
	a()
	a() // once
	assert.Equal(t, openingGC, gcPercent(), "another open is under way")
	b()
	assert.Equal(t, -1, gcPercent(), "back to collecting at the limit")

	debug.SetGCPercent(50) // $GOGC set
	c := Opening()
	assert.Equal(t, 50, gcPercent())
	c()
	assert.Equal(t, 50, gcPercent())
}
