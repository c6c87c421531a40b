//go:build race

package ckpt

// slowdown scales time bounds: the race detector makes code ~10x slower.
const slowdown = 10
