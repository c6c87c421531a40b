package main

// memoryLimit is the Go memory limit of a mount: the block cache's bound,
// the open views' metadata (the LRU closes views beyond the budget; the
// newest, being decoded, may pass it by its own size), and the headroom.
// Below the metadata a decode of a large .metadata ran the collector
// without pause (BENCHMARKS.md, run V).
func memoryLimit(cacheBound, metadataBudget int64) int64 {
	return cacheBound + metadataBudget + memoryHeadroom
}
