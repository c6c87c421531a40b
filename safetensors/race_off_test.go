//go:build !race

package safetensors

// raceEnabled skips tests too slow under the race detector.
const raceEnabled = false
