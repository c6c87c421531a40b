package torchdcp

import (
	"errors"
	"slices"
	"strings"

	"github.com/ckptfs/ckptfs/layout/pickle"
)

// Decoding a .metadata for opening: the restricted pickle VM hands each
// chunk, index and storage info to a sink (pickle.Sink) as it completes,
// which keeps them in flat per-tensor arrays, so that a .metadata of
// millions of chunks never becomes a tree of millions of pickle values, or
// a map of millions of storage keys. The sink is a pickle.RecordSink: the
// VM reads those three classes (recordClasses) as records, their fields
// straight from the opcodes into the arrays, never building their Objects
// (BuiltRecord); one it cannot read so (a field of another shape, an
// object the memo shares) it builds and offers to Built, whose fields are
// read by the same decoders as DecodeMetadata's (metadataread.go), and
// the root by the same mapping. A file the stream cannot take (a chunk
// object shared through the memo, storage entries before their tensors are
// named, anything it finds wrong) is decoded again the general way, whose
// result or error is the one returned: the stream is never more lenient,
// and its errors are the general decoder's.

// stream is the pickle.Sink of a .metadata decoding, and afterwards the
// storage of every chunk.
type stream struct {
	// Chunks built and not yet claimed by a TensorStorageMetadata: their
	// offsets then sizes, rank each, back to back in pendDims.
	pendDims []int64
	pendRank []int32
	pendBase int // chunkRef of pend[0]

	tensors []*streamTensor
	byFQN   map[string]*streamTensor
	// tensorSlab: tensors are made 64 at a time, adjacent in the order
	// they are decoded, the order each rank's storage entries visit them;
	// packed is how many tensors' names pack laid out.
	tensorSlab []streamTensor
	packed     int
	// objects are the storage of entries without offsets (BYTE_IO).
	objects map[string]StorageInfo
	// late are storage entries that came before their tensor was named.
	late []streamEntry
	// batch are storage entries whose tensor is known, placed by flush;
	// touched is what its first pass read, kept so that the reads are made.
	batch   []placing
	touched int64

	files    []string // relative paths, by storedChunk.file
	fileIdx  map[string]int32
	lastFile int32      // the file of the last storage entry
	xforms   [][]string // transform descriptor lists; 0 is none
	xformIx  map[string]uint32

	storageDict *pickle.Dict  // the dict the storage entries went into
	last        *streamTensor // the tensor of the last storage entry
	named       *streamTensor // the tensor whose name Str found last
	// records and built count the chunks, indexes and storage infos
	// taken as records (BuiltRecord) and as objects (Built); noRecords
	// takes none as records (tests compare the two ways).
	records, built int
	noRecords      bool
	hinted         int // storage entries placed by their index hint
	// release drops the pages of the mapped .metadata the decoder is
	// done with (pickle.Options.Release); nil when it is not mapped.
	release func(lo, hi int)
	slabs   refSlabs
}

// streamTensor is one TensorStorageMetadata and the storage of its chunks.
type streamTensor struct {
	t     *TensorMetadata
	fqn   string
	box   any           // fqn, boxed once for Str
	after *streamTensor // the tensor whose name Str found after this one's, last time
	store []storedChunk
	order []int32 // chunk indices sorted by offsets, made on first look-up
	next  int     // where in order the last look-up ended
	// dup: two chunks have the same offsets (known once order is made);
	// then an entry's index hint is not enough to place it.
	dup bool
}

// storedChunk is where a chunk's record is: file -1 when no storage entry
// names it.
type storedChunk struct {
	file   int32
	xform  uint32
	off    int64
	length int64
}

// The values the sink leaves in the pickle in place of what it took; their
// own types, so nothing in the file can forge them.
type (
	chunkRef  int
	tensorRef struct{ t *streamTensor }
	indexRef  struct {
		idx Index
		// hint is MetadataIndex.index, the chunk's position in its
		// tensor's chunks (-1: none); torch itself only trusts it once
		// the chunk's offsets match, and so does put.
		hint int64
		// t is the tensor Str found its fqn for (nil: none), which put
		// checks.
		t *streamTensor
	}
	infoRef struct{ info StorageInfo }
)

type streamEntry struct {
	idx  Index
	hint int64
	t    *streamTensor
	info StorageInfo
}

// placing is a storage entry of a known tensor, as flush places it.
type placing struct {
	st   *streamTensor
	hint int64
	offs []int64
	sc   storedChunk
}

// batchLen is the entries flush places at once: enough to span a few
// ranks' entries of a large checkpoint, whose chunks of one tensor share
// lines (BENCHMARKS.md, run AA-decode), few enough that the lines its
// first pass reads stay in the caches until the second pass uses them (a
// var: tests flush after every entry or two).
var batchLen = 16384

// errStream is a file the stream does not take; decoding is redone the
// general way.
var errStream = errors.New("not streamable")

func newStream() *stream {
	return &stream{byFQN: map[string]*streamTensor{}, objects: map[string]StorageInfo{},
		fileIdx: map[string]int32{}, xforms: [][]string{nil}, xformIx: map[string]uint32{}}
}

// recordClasses are the classes the stream takes (as pickle records, their
// fields read straight from the opcodes with no Object built, or as the
// Objects the VM built when it could not), and what each is: the one place
// the stream accepts a class. A class the general decoders (metadataread.go)
// accept and this table lacks is left in the tree, where the mapping of the
// root finds it in storage_data (errStream: the general way decodes the file).
// Storage entries are of any of storageInfoClasses.
var recordClasses = func() map[pickle.Global]recordClass {
	m := map[pickle.Global]recordClass{
		{Module: modMetadata, Name: "ChunkStorageMetadata"}: recordChunk,
		{Module: modMetadata, Name: "MetadataIndex"}:        recordIndex,
	}
	for _, g := range storageInfoClasses {
		m[g] = recordInfo
	}
	return m
}()

type recordClass = int // pickle.Record.Tag

const (
	recordNone recordClass = iota
	recordChunk
	recordIndex
	recordInfo
)

// RecordClass implements pickle.RecordSink.
func (s *stream) RecordClass(g pickle.Global) int {
	if s.noRecords {
		return recordNone
	}
	return recordClasses[g]
}

// BuiltRecord implements pickle.RecordSink: it takes a record as Built
// takes the object, reading its fields as metadataread.go's decoders do;
// a record they would not read the same way (a field missing, of another
// type) is left to the VM, which offers Built the object, whose decoders
// then say what is wrong. The fields are read in one pass, each by its
// name (a record's names are distinct): looking each up compared the same
// strings again, for every chunk.
func (s *stream) BuiltRecord(r *pickle.Record) (any, bool, error) {
	switch r.Tag {
	case recordChunk:
		var off, sz []int64
		var ok1, ok2 bool
		for i := range r.Len() {
			switch f := r.At(i); f.Name {
			case "offsets":
				off, ok1 = fieldSize(f)
			case "sizes":
				sz, ok2 = fieldSize(f)
			}
		}
		if !ok1 || !ok2 || len(off) != len(sz) {
			return nil, false, nil
		}
		s.pendDims = append(append(s.pendDims, off...), sz...)
		s.pendRank = append(s.pendRank, int32(len(off)))
		s.records++
		return s.slabs.chunk(s.pendBase + len(s.pendRank) - 1), true, nil
	case recordIndex:
		var idx Index
		var off []int64
		var hasFQN, hasOff bool
		hint := int64(-1)
		for i := range r.Len() {
			switch f := r.At(i); f.Name {
			case "index":
				if f.Kind() == pickle.KindInt {
					hint = f.Int()
				}
			case "fqn":
				if f.Kind() != pickle.KindStr {
					return nil, false, nil
				}
				idx.FQN, hasFQN = f.Str(), true
			case "offset":
				if f.Kind() == pickle.KindNone {
					continue
				}
				if off, hasOff = fieldSize(f); !hasOff {
					return nil, false, nil
				}
			}
		}
		if !hasFQN {
			return nil, false, nil
		}
		if hasOff {
			idx.Offset = s.slabs.ints(off) // not nil: as decodeSize, a 0-dim tensor's chunk
		}
		s.records++
		ref := s.slabs.index()
		ref.idx, ref.hint, ref.t = idx, hint, nil
		if n := s.named; n != nil && n.fqn == idx.FQN { // its fqn field, read by Str
			ref.t = n
		}
		return ref, true, nil
	case recordInfo:
		var info StorageInfo
		var path, offset, length bool
		for i := range r.Len() {
			f := r.At(i)
			switch k := f.Kind(); f.Name {
			case "relative_path":
				if k != pickle.KindStr {
					return nil, false, nil
				}
				info.RelativePath, path = f.Str(), true
			case "offset":
				if k != pickle.KindInt {
					return nil, false, nil
				}
				info.Offset, offset = f.Int(), true
			case "length":
				if k != pickle.KindInt {
					return nil, false, nil
				}
				info.Length, length = f.Int(), true
			case "transform_descriptors":
				switch {
				case k == pickle.KindNone:
				case k != pickle.KindStrs:
					return nil, false, nil
				case len(f.Strs()) > 0: // an empty list is nil, as decodeStorageInfo has it
					info.TransformDescriptors = slices.Clone(f.Strs())
				}
			}
		}
		if !path || !offset || !length {
			return nil, false, nil
		}
		s.records++
		ref := s.slabs.info()
		ref.info = info
		return ref, true, nil
	}
	return nil, false, nil
}

// fieldSize is a torch.Size field (or, leniently, a tuple of ints), as
// decodeSize reads it.
func fieldSize(f pickle.Field) ([]int64, bool) {
	switch f.Kind() {
	case pickle.KindInts:
	case pickle.KindCall:
		if g := f.Func(); g.Module != "torch" || g.Name != "Size" {
			return nil, false
		}
	default:
		return nil, false
	}
	return f.Ints(), true
}

// refSlabs hand out the values BuiltRecord leaves for a chunk, and for a
// storage entry's key and value and its offsets, a thousand per
// allocation: one allocation each was a third of decoding a .metadata.
// SetItem takes an entry's right away, a tensor its chunks'; a slab is
// garbage once its last one is.
type refSlabs struct {
	chunks  []chunkRef
	indexes []indexRef
	infos   []infoRef
	offs    []int64
}

const refSlab = 1024

// chunk is a chunk's place among the pending ones, a pointer (an int in
// an interface was an allocation per chunk).
func (r *refSlabs) chunk(v int) *chunkRef {
	if len(r.chunks) == 0 {
		r.chunks = make([]chunkRef, refSlab)
	}
	p := &r.chunks[0]
	r.chunks = r.chunks[1:]
	*p = chunkRef(v)
	return p
}

func (r *refSlabs) index() *indexRef {
	if len(r.indexes) == 0 {
		r.indexes = make([]indexRef, refSlab)
	}
	p := &r.indexes[0]
	r.indexes = r.indexes[1:]
	return p
}

func (r *refSlabs) info() *infoRef {
	if len(r.infos) == 0 {
		r.infos = make([]infoRef, refSlab)
	}
	p := &r.infos[0]
	r.infos = r.infos[1:]
	return p
}

// ints copies v, never nil, with a capacity of its length.
func (r *refSlabs) ints(v []int64) []int64 {
	switch {
	case len(v) == 0:
		return []int64{}
	case len(v) > refSlab/8:
		return slices.Clone(v)
	}
	if len(r.offs) < len(v) {
		r.offs = make([]int64, refSlab)
	}
	out := r.offs[:len(v):len(v)]
	r.offs = r.offs[len(v):]
	copy(out, v)
	return out
}

// Built implements pickle.Sink: it takes what BuiltRecord takes, when the
// VM built it (a record it could not read), and TensorStorageMetadata.
func (s *stream) Built(obj *pickle.Object) (any, bool, error) {
	if obj.Is(modMetadata, "TensorStorageMetadata") {
		st, err := s.tensor(obj)
		if err != nil {
			return nil, false, err
		}
		return tensorRef{st}, true, nil
	}
	switch recordClasses[obj.Class] {
	case recordChunk:
		c, err := decodeChunk(obj)
		if err != nil {
			return nil, false, err
		}
		if len(c.Offsets) != len(c.Sizes) {
			return nil, false, errStream // the general way says which
		}
		s.pendDims = append(append(s.pendDims, c.Offsets...), c.Sizes...)
		s.pendRank = append(s.pendRank, int32(len(c.Offsets)))
		s.built++
		return s.slabs.chunk(s.pendBase + len(s.pendRank) - 1), true, nil
	case recordIndex:
		idx, err := decodeIndex(obj)
		if err != nil {
			return nil, false, err
		}
		s.built++
		return &indexRef{idx: idx, hint: indexHint(obj)}, true, nil
	case recordInfo:
		info, err := decodeStorageInfo(obj)
		if err != nil {
			return nil, false, err
		}
		s.built++
		return &infoRef{info}, true, nil
	}
	return nil, false, nil
}

// tensor decodes a TensorStorageMetadata whose chunks are the pending
// ones, in order, and copies their dims into one array of its own: flat,
// when every chunk has the tensor's rank (no ChunkMetadata is made), else
// Chunks, slices of it.
func (s *stream) tensor(obj *pickle.Object) (*streamTensor, error) {
	var pos, n int
	var dims []int64
	// uniform: every pending chunk has one rank (then only their count
	// and order are checked here).
	uniform := !slices.ContainsFunc(s.pendRank, func(r int32) bool { return r != s.pendRank[0] })
	claim := func(i int, v any) (ChunkMetadata, error) {
		ref, ok := v.(*chunkRef)
		if !ok || int(*ref) != s.pendBase+i || i >= len(s.pendRank) {
			return ChunkMetadata{}, errStream
		}
		n++
		if uniform {
			return ChunkMetadata{}, nil
		}
		r := int(s.pendRank[i])
		c := ChunkMetadata{Offsets: dims[pos : pos+r : pos+r], Sizes: dims[pos+r : pos+2*r : pos+2*r]}
		pos += 2 * r
		return c, nil
	}
	// The dims of every pending chunk, copied once: the chunks claimed
	// are the first ones, in order (claim checks).
	dims = append(make([]int64, 0, len(s.pendDims)), s.pendDims...)
	t, err := decodeTensor("", obj, claim, !uniform)
	if err != nil {
		return nil, err
	}
	if n != len(s.pendRank) {
		return nil, errStream // chunks built outside any tensor's list
	}
	switch {
	case n == 0 || (uniform && int(s.pendRank[0]) == len(t.Size)):
		t.flat, t.n = dims, n
	case uniform:
		// Chunks of another rank than the tensor's: kept as they are,
		// for Validate to report.
		r := int(s.pendRank[0])
		t.Chunks = make([]ChunkMetadata, n)
		for i := range t.Chunks {
			b := dims[2*r*i : 2*r*(i+1) : 2*r*(i+1)]
			t.Chunks[i] = ChunkMetadata{Offsets: b[:r:r], Sizes: b[r:]}
		}
	}
	s.pendBase += n
	s.pendDims, s.pendRank = s.pendDims[:0], s.pendRank[:0]
	if len(s.tensorSlab) == 0 {
		s.tensorSlab = make([]streamTensor, 64)
	}
	st := &s.tensorSlab[0]
	s.tensorSlab = s.tensorSlab[1:]
	*st = streamTensor{t: t, store: make([]storedChunk, n)}
	for i := range st.store {
		st.store[i].file = -1
	}
	s.tensors = append(s.tensors, st)
	return st, nil
}

// SetItem implements pickle.Sink: it names tensors (state_dict_metadata
// items) and takes storage entries.
func (s *stream) SetItem(dict *pickle.Dict, key, value any) (bool, error) {
	if tr, ok := value.(tensorRef); ok {
		fqn, ok := key.(string)
		if !ok || tr.t.fqn != "" || s.byFQN[fqn] != nil {
			return false, errStream
		}
		tr.t.fqn, tr.t.box = fqn, fqn
		s.byFQN[fqn] = tr.t
		return false, nil
	}
	ir, ok := key.(*indexRef)
	if !ok {
		return false, nil
	}
	fr, ok := value.(*infoRef)
	if !ok || (s.storageDict != nil && s.storageDict != dict) {
		return false, errStream
	}
	s.storageDict = dict
	if e := (streamEntry{ir.idx, ir.hint, ir.t, fr.info}); !s.put(e) {
		s.late = append(s.late, e)
	}
	return true, nil
}

// put records a storage entry; false when its tensor is not named yet. A
// later entry of the same key replaces an earlier one, as in Python.
func (s *stream) put(e streamEntry) bool {
	idx, info := e.idx, e.info
	if idx.Offset == nil {
		s.objects[idx.FQN] = info
		return true
	}
	// The tensor Str found the name for (then idx.FQN is its string:
	// equal at the first compare), or the last entry's, or by the map.
	st := e.t
	if st == nil || st.fqn != idx.FQN {
		if st = s.last; st == nil || st.fqn != idx.FQN {
			if st = s.byFQN[idx.FQN]; st == nil {
				return false
			}
		}
	}
	s.last = st
	sc := storedChunk{file: s.file(info.RelativePath), xform: s.xform(info.TransformDescriptors),
		off: info.Offset, length: info.Length}
	if s.batch == nil {
		s.batch = make([]placing, 0, batchLen)
	}
	s.batch = append(s.batch, placing{st, e.hint, idx.Offset, sc})
	if len(s.batch) >= batchLen {
		s.flush()
	}
	return true
}

// flush places the batch's entries, in order. Entries come rank by rank,
// each of another tensor than the last: the chunk its hint names and its
// storage slot are lines no cache holds, and placing entries one by one
// waited for each in turn. A first pass reads them all, each read
// independent of the others, so that the CPU has many under way at once.
func (s *stream) flush() {
	var sum int64
	for i := range s.batch {
		p := &s.batch[i]
		if t, h := p.st.t, p.hint; t.flat != nil && h >= 0 && h < int64(t.n) {
			if r := len(t.Size); r > 0 {
				sum += t.flat[2*r*int(h)]
			}
			sum += int64(p.st.store[h].file) + int64(len(p.st.order)) // order: maybe another line of st
		}
	}
	s.touched += sum
	for i := range s.batch {
		p := &s.batch[i]
		s.place(p.st, p.hint, p.offs, p.sc)
	}
	clear(s.batch) // keep none of their offsets alive
	s.batch = s.batch[:0]
}

// place puts an entry where a lookup finds it: at its hint when that is
// the one chunk of its offsets, else at every chunk of them (find).
func (s *stream) place(st *streamTensor, hint int64, offs []int64, sc storedChunk) {
	if i, ok := st.hinted(hint, offs); ok {
		st.store[i] = sc
		s.hinted++
		return
	}
	for _, i := range st.find(offs) {
		st.store[i] = sc
	}
}

// Str implements pickle.StrSink: a storage entry's fqn (pickled in full
// for each, in a real .metadata) is its tensor's name, boxed once, not a
// new string. Entries come rank by rank, and each rank's visit the tensors
// in the order the last one's did: the tensor of the name found last, then
// the one whose name came after it last time, are tried before the map.
func (s *stream) Str(b []byte) any {
	if len(s.tensors) >= 2*s.packed+1 {
		s.pack()
	}
	st := s.named
	if st != nil && st.fqn != string(b) {
		st = st.after
	}
	if st == nil || st.fqn != string(b) {
		if st = s.byFQN[string(b)]; st == nil {
			return nil
		}
		if s.named != nil {
			s.named.after = st
		}
	}
	s.named = st
	return st.box
}

// pack lays the names of the tensors named so far out in one string, in
// the order they were named: the names Str compares, rank after rank,
// are then read in sequence, not from one line here and one there. It
// runs when the tensors have doubled since the last time.
func (s *stream) pack() {
	n := 0
	for _, st := range s.tensors {
		n += len(st.fqn)
	}
	var b strings.Builder
	b.Grow(n)
	for _, st := range s.tensors {
		b.WriteString(st.fqn)
	}
	all := b.String()
	for _, st := range s.tensors {
		if st.fqn != "" {
			st.fqn, all = all[:len(st.fqn)], all[len(st.fqn):]
			st.box = st.fqn
		}
	}
	s.packed = len(s.tensors)
}

func (s *stream) file(rel string) int32 {
	// Entries come rank after rank, each rank's in its own file (a real
	// .metadata), or tensor after tensor, each chunk in the next rank's
	// file: the last entry's file, then the one after it, are tried
	// before the map.
	if i := s.lastFile; i >= 0 && i < int32(len(s.files)) && s.files[i] == rel {
		return i
	}
	if i := s.lastFile + 1; i < int32(len(s.files)) && s.files[i] == rel {
		s.lastFile = i
		return i
	}
	i, ok := s.fileIdx[rel]
	if !ok {
		i = int32(len(s.files))
		s.files = append(s.files, rel)
		s.fileIdx[rel] = i
	}
	s.lastFile = i
	return i
}

func (s *stream) xform(desc []string) uint32 {
	if desc == nil {
		return 0
	}
	key := strings.Join(desc, "\x00") + "\x00"
	if i, ok := s.xformIx[key]; ok {
		return i
	}
	i := uint32(len(s.xforms))
	s.xforms = append(s.xforms, desc)
	s.xformIx[key] = i
	return i
}

// hinted is chunk hint when its offsets are offs and no other chunk's
// are: then it is the one chunk find would return, found with one
// comparison (a real .metadata has every entry's hint, and its entries
// come rank by rank, where find's own guess, the chunk after the last
// look-up's, took four).
func (st *streamTensor) hinted(hint int64, offs []int64) (int32, bool) {
	st.sort()
	if st.dup || hint < 0 || hint >= int64(len(st.order)) {
		return 0, false
	}
	if o, _ := st.t.chunk(int(hint)); !slices.Equal(o, offs) {
		return 0, false
	}
	return int32(hint), true
}

// sort makes order, once, and learns whether chunks repeat.
func (st *streamTensor) sort() {
	if st.order != nil {
		return
	}
	at := func(i int32) []int64 { o, _ := st.t.chunk(int(i)); return o }
	st.order = make([]int32, st.t.numChunks())
	for i := range st.order {
		st.order[i] = int32(i)
	}
	// One pass says both whether order is sorted already (as the chunks
	// of a split on dim 0 are) and, if so, whether two chunks are equal.
	sorted := true
	for i := 1; i < len(st.order) && sorted; i++ {
		switch slices.Compare(at(int32(i-1)), at(int32(i))) {
		case 1:
			sorted = false
		case 0:
			st.dup = true
		}
	}
	if sorted {
		return
	}
	st.dup = false
	slices.SortStableFunc(st.order, func(a, b int32) int { return slices.Compare(at(a), at(b)) })
	for i := 1; i < len(st.order) && !st.dup; i++ {
		st.dup = slices.Equal(at(st.order[i-1]), at(st.order[i]))
	}
}

// find returns the chunks whose offsets are offs (more than one only when
// chunks repeat, which Validate reports).
func (st *streamTensor) find(offs []int64) []int32 {
	at := func(i int32) []int64 { o, _ := st.t.chunk(int(i)); return o }
	st.sort()
	// Storage entries come in the chunks' order, mostly: try where the
	// last one ended first (the first of a run of equal offsets).
	lo := st.next
	if lo >= len(st.order) || !slices.Equal(at(st.order[lo]), offs) || (lo > 0 && slices.Equal(at(st.order[lo-1]), offs)) {
		lo, _ = slices.BinarySearchFunc(st.order, offs, func(i int32, o []int64) int { return slices.Compare(at(i), o) })
	}
	hi := lo
	for hi < len(st.order) && slices.Equal(at(st.order[hi]), offs) {
		hi++
	}
	st.next = hi
	return st.order[lo:hi]
}

// finish places the storage entries that came early, once decoding ended
// and every tensor is named, and checks that every tensor was.
func (s *stream) finish() error {
	for _, e := range s.late {
		s.put(e) // a tensor never named: torch ignores the entry too
	}
	s.late = nil
	s.flush() // after the batch's entries, as put would have placed them
	s.batch = nil
	for _, st := range s.tensors {
		if st.fqn == "" {
			return errStream // a tensor outside state_dict_metadata
		}
		st.order = nil
	}
	if len(s.pendRank) > 0 {
		return errStream
	}
	return nil
}

// lookup is the storage of chunk i of the tensor fqn (i < 0: the object
// fqn), as Metadata.Lookup finds it.
func (s *stream) lookup(fqn string, i int) (StorageInfo, bool) {
	if i < 0 {
		info, ok := s.objects[fqn]
		return info, ok
	}
	st := s.byFQN[fqn]
	if st == nil || i >= len(st.store) || st.store[i].file < 0 {
		return StorageInfo{}, false
	}
	return s.info(st.store[i]), true
}

// info is the storage of a chunk stored somewhere.
func (s *stream) info(sc storedChunk) StorageInfo {
	return StorageInfo{RelativePath: s.files[sc.file], Offset: sc.off, Length: sc.length,
		TransformDescriptors: s.xforms[sc.xform]}
}

// decodeMetadataStream decodes data as decodeMetadataBytes does, through
// the stream s, and returns the Metadata without storage entries (Storage
// is empty; the stream has them), or nil and the general decoder's verdict.
func decodeMetadataStream(data []byte, maxBytes int64, s *stream) (*Metadata, *stream, error) {
	m, err := decodeMetadataWith(data, maxBytes, s)
	if err == nil {
		err = s.finish()
	}
	if err != nil {
		// The general way decides, and words the error.
		m, err := decodeMetadataBytes(data, maxBytes)
		return m, nil, err
	}
	return m, s, nil
}

// indexHint is a built MetadataIndex's index (-1: none, or not an int),
// the hint BuiltRecord reads from a record.
func indexHint(obj *pickle.Object) int64 {
	st, err := classState(obj, modMetadata, "MetadataIndex")
	if err != nil {
		return -1
	}
	v, ok := st.Get("index")
	if !ok {
		return -1
	}
	if n, ok := pickle.Int(v); ok {
		return n
	}
	return -1
}
