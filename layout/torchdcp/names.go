package torchdcp

import (
	"fmt"
	"path"
	"regexp"
	"strconv"
)

// The names of a FileSystemWriter checkpoint's own files (FORMATS.md §1,
// §3.1). Every other package spells them through these.
const (
	// MetadataFile is the global index: the .metadata pickle.
	MetadataFile = ".metadata"
	// MetadataTmp is the index being written; renamed over MetadataFile.
	MetadataTmp = MetadataFile + ".tmp"
	// shardExt ends every shard file name.
	shardExt = ".distcp"
)

var (
	shardName         = regexp.MustCompile(`^__([0-9]+)_([0-9]+)\.distcp$`)
	rankLocalMetadata = regexp.MustCompile(`^__[0-9]+\.metadata$`)
)

// ShardName is the name torch gives the n-th file of a rank: __{rank}_{n}.distcp.
func ShardName(rank, n int) string { return fmt.Sprintf("__%d_%d%s", rank, n, shardExt) }

// ParseShardName returns the rank and file number of a name ShardName
// makes; ok is false for any other name.
func ParseShardName(name string) (rank, n int, ok bool) {
	m := shardName.FindStringSubmatch(name)
	if m == nil {
		return 0, 0, false
	}
	rank, err1 := strconv.Atoi(m[1])
	n, err2 := strconv.Atoi(m[2])
	return rank, n, err1 == nil && err2 == nil
}

// IsRankLocalMetadata reports whether name is the index of one rank that
// dcp.save(use_collectives=False) writes instead of MetadataFile:
// __{rank}.metadata.
func IsRankLocalMetadata(name string) bool { return rankLocalMetadata.MatchString(name) }

// IsInternal reports whether name is a file of the DCP format itself (the
// index, the index being written, shards), which an HF view replaces.
func IsInternal(name string) bool {
	return name == MetadataFile || name == MetadataTmp || path.Ext(name) == shardExt
}
