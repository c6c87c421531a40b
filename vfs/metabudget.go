package vfs

// The metadata budget: the open views' indexes (chunk offsets, sizes and
// sources; generated headers) are the mount's memory besides the block
// cache, and a checkpoint of hundreds of ranks holds hundreds of MB of
// them. The views are closed least recently used first while their
// resident metadata (view.View.ResidentBytes, counted when each opens)
// exceeds the budget, as they are for descriptors; the newest view always
// stays, so one view larger than the budget still opens. A process's Go
// memory limit is then cache + metadata budget + headroom (cmd/ckptfs).

// DefaultMetadataBudget is Options.MetadataBudget's default: with the
// default cache, the mount's Go memory limit is then about 1 GiB.
const DefaultMetadataBudget = 512 << 20

func (o Options) metadataBudget() int64 {
	if o.MetadataBudget <= 0 {
		return DefaultMetadataBudget
	}
	return o.MetadataBudget
}
