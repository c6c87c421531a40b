package torchdcp

import (
	"slices"
	"strconv"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/pickle"
)

// Class paths of the .metadata pickle (FORMATS.md §2.2).
const (
	modMetadata   = "torch.distributed.checkpoint.metadata"
	modShardMeta  = "torch.distributed._shard.sharded_tensor.metadata"
	modFilesystem = "torch.distributed.checkpoint.filesystem"
	modMCore      = "megatron.core.dist_checkpointing.strategies.torch"
)

// storageInfoClasses are the classes a storage entry is pickled as, each
// decoded by its fields (relative_path, offset, length,
// transform_descriptors) as torch's is, never executed: torch's
// FileSystemWriter's, and OLMo-core's RemoteFileSystemWriter's (a
// dataclass of its own with the same fields). The one place a
// framework's storage entry class is accepted.
var storageInfoClasses = []pickle.Global{
	{Module: modFilesystem, Name: "_StorageInfo"},
	{Module: "olmo_core.distributed.checkpoint.filesystem", Name: "_StorageInfo"},
}

// isStorageInfo reports whether obj is of a storageInfoClasses class.
func isStorageInfo(obj *pickle.Object) bool {
	for _, g := range storageInfoClasses {
		if obj.Is(g.Module, g.Name) {
			return true
		}
	}
	return false
}

// Metadata is a DCP .metadata file: what DecodeMetadata reads and
// EncodeMetadata writes.
type Metadata struct {
	// Class is the root class: torch's Metadata, or Megatron's MCoreMetadata
	// (a Metadata subclass, decoded the same way).
	Class pickle.Global
	// Items is state_dict_metadata in file order.
	Items []Item
	// Planner is planner_data as the default planner writes it: each flat
	// key with the path of the nesting it was flattened from, in file
	// order. Nil when planner_data is absent or None; empty, not nil, for an
	// empty dict (the two are written back differently).
	Planner []PlannerEntry
	// PlannerErr says how planner_data is not the default planner's mapping
	// (a custom planner may store anything there); Planner then holds the
	// entries that are paths. A writer cannot carry such data over.
	PlannerErr error
	// PlannerData is Planner as a map for readers, the path elements as
	// strings (integers in decimal). Nil when Planner is.
	PlannerData map[string][]string
	// Storage is storage_data in file order.
	Storage []StorageEntry
	// Version is Metadata.version ("" when absent).
	Version string
	// MCoreData is Megatron's mcore_data (fqn → dict), nil when absent.
	MCoreData *pickle.Dict

	storage map[string]int // Index.Key → index in Storage
}

// PlannerEntry is one planner_data entry: dcp.save flattened the value at
// Path (str keys, int list indices: string and int64 elements) to Key.
type PlannerEntry struct {
	Key  string
	Path []any
}

// Item is one state_dict_metadata entry: a tensor, or a BYTE_IO value when
// Tensor is nil.
type Item struct {
	FQN    string
	Tensor *TensorMetadata
}

// TensorMetadata is a TensorStorageMetadata.
type TensorMetadata struct {
	Properties TensorProperties
	// Size is the global shape.
	Size   []int64
	Chunks []ChunkMetadata

	// Open's decoding (metadatastream.go) keeps the chunks of a tensor
	// whose chunks all have its rank as n boxes in flat, offsets then
	// sizes, and Chunks nil: 48 bytes a chunk less.
	flat []int64
	n    int
}

// numChunks is the number of chunks, in either form.
func (t *TensorMetadata) numChunks() int {
	if t.flat != nil {
		return t.n
	}
	return len(t.Chunks)
}

// chunk returns chunk i's offsets and sizes, in either form.
func (t *TensorMetadata) chunk(i int) (offsets, sizes []int64) {
	if t.flat != nil {
		r := len(t.Size)
		b := t.flat[2*r*i : 2*r*(i+1) : 2*r*(i+1)]
		return b[:r:r], b[r:]
	}
	return t.Chunks[i].Offsets, t.Chunks[i].Sizes
}

// TensorProperties is a TensorProperties (5-tuple state, or 6 with strides).
type TensorProperties struct {
	// DType is the torch dtype name without "torch." ("bfloat16").
	DType string
	// Layout is the layout name ("torch.strided").
	Layout       string
	RequiresGrad bool
	// MemoryFormat is the _MEM_FORMAT_ENCODING value (0 = contiguous).
	MemoryFormat int64
	PinMemory    bool
	// Strides is the 6th state element of newer torch, nil when absent or None.
	Strides []int64
}

// ChunkMetadata is a ChunkStorageMetadata: a box of the global tensor.
type ChunkMetadata struct {
	Offsets []int64
	Sizes   []int64
}

// Index is a MetadataIndex. Offset is nil for BYTE_IO items (no offset) and
// the chunk offsets for tensor chunks (empty, not nil, for 0-dim tensors).
type Index struct {
	FQN    string
	Offset []int64
}

// StorageInfo is a filesystem _StorageInfo: where an item's bytes live.
type StorageInfo struct {
	RelativePath string
	Offset       int64
	Length       int64
	// TransformDescriptors lists stream transforms, outermost first
	// (["stream.zstd/1"]); nil when none.
	TransformDescriptors []string
}

// StorageEntry is one storage_data entry.
type StorageEntry struct {
	Index Index
	Info  StorageInfo
}

// Lookup finds the storage of (fqn, offset) the way torch does: by fqn and
// offset only. offset nil means "no offset" (BYTE_IO).
func (m *Metadata) Lookup(fqn string, offset []int64) (StorageInfo, bool) {
	i, ok := m.lookupFrom(-1, fqn, offset)
	if !ok {
		return StorageInfo{}, false
	}
	return m.Storage[i].Info, true
}

// lookupFrom returns the index in Storage of (fqn, offset) as Lookup finds
// it, trying Storage[hint] first: torch writes storage_data in the order of
// the chunks, so a caller that looks chunks up in order with the entry after
// the last one found as the hint hashes no key (map look-ups showed in the
// profile of a mount of many chunks).
func (m *Metadata) lookupFrom(hint int, fqn string, offset []int64) (int, bool) {
	// Each key of the index names one entry, so when it indexes them all a
	// matching entry is the one it would find.
	if hint >= 0 && hint < len(m.Storage) && len(m.storage) == len(m.Storage) &&
		m.Storage[hint].Index.is(fqn, offset) {
		return hint, true
	}
	var buf [64]byte
	i, ok := m.storage[string(appendKey(buf[:0], fqn, offset))] // no allocation
	return i, ok
}

// is reports whether i has the Key of (fqn, offset), without building it.
func (i Index) is(fqn string, offset []int64) bool {
	return i.FQN == fqn && (i.Offset == nil) == (offset == nil) && slices.Equal(i.Offset, offset)
}

// Key identifies the index as torch compares MetadataIndex: by fqn and
// offset only.
func (i Index) Key() string {
	var buf [64]byte
	return string(appendKey(buf[:0], i.FQN, i.Offset))
}

// appendKey appends the Key of (fqn, offset) to b.
func appendKey(b []byte, fqn string, offset []int64) []byte {
	b = append(b, fqn...)
	b = append(b, 0)
	if offset == nil {
		return append(b, '-')
	}
	for _, o := range offset {
		b = strconv.AppendInt(b, o, 10)
		b = append(b, ',')
	}
	return b
}

// With returns a copy of m with items, planner entries and storage entries
// appended: the index a writer commits next. m is not changed. The copy's
// Planner is never nil (planner_data is written as a dict), and a storage
// entry with the key of an earlier one replaces it, as in a decoded file.
func (m *Metadata) With(items []Item, planner []PlannerEntry, storage []StorageEntry) *Metadata {
	c := *m
	c.Items = append(slices.Clip(m.Items), items...)
	c.Planner = append(slices.Clip(m.Planner), planner...)
	if c.Planner == nil {
		c.Planner = []PlannerEntry{}
	}
	c.PlannerData = make(map[string][]string, len(c.Planner))
	for _, e := range c.Planner {
		c.PlannerData[e.Key] = pathStrings(e.Path)
	}
	c.Storage = slices.Clone(m.Storage) // addStorage may replace an entry
	c.storage = make(map[string]int, len(m.Storage)+len(storage))
	for i, s := range c.Storage {
		c.storage[s.Index.Key()] = i
	}
	for _, s := range storage {
		c.addStorage(s)
	}
	return &c
}

// addStorage appends s, or replaces the entry with its key.
func (m *Metadata) addStorage(s StorageEntry) {
	if m.storage == nil {
		m.storage = map[string]int{}
	}
	key := s.Index.Key()
	if j, ok := m.storage[key]; ok {
		m.Storage[j].Info = s.Info
		return
	}
	m.storage[key] = len(m.Storage)
	m.Storage = append(m.Storage, s)
}

// pathStrings is a planner path with its int elements in decimal.
func pathStrings(path []any) []string {
	out := make([]string, len(path))
	for i, e := range path {
		switch x := e.(type) {
		case string:
			out[i] = x
		case int64:
			out[i] = strconv.FormatInt(x, 10)
		}
	}
	return out
}

// FieldError is a .metadata value of the wrong shape; Field names where it is
// (state_dict_metadata["w"].chunks[0].sizes).
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return "field " + e.Field + ": " + e.Msg }

// Unwrap makes errors.Is(err, ckpt.ErrInvalid) hold.
func (e *FieldError) Unwrap() error { return ckpt.ErrInvalid }

// String formats an index as in error messages: "w"(2,0) or "step".
func (i Index) String() string {
	if i.Offset == nil {
		return strconv.Quote(i.FQN)
	}
	return strconv.Quote(i.FQN) + formatOffsets(i.Offset)
}

// formatOffsets renders chunk offsets as a tuple: (2,0), or () for 0-dim.
func formatOffsets(o []int64) string {
	var b strings.Builder
	b.WriteByte('(')
	for i, v := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(v, 10))
	}
	b.WriteByte(')')
	return b.String()
}
