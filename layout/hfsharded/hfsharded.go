// Package hfsharded reads the HF-flavoured sharded safetensors checkpoints
// written by torch's HuggingFaceStorageWriter(save_distributed=True) and NeMo
// AutoModel: shard-0000K-model-0000N-of-0000M.safetensors files whose
// __metadata__ carries DCP_SHARDING_INFO, the global offset of each local
// piece. Each piece becomes one chunk; the global shape is the elementwise
// max of offset + shape, as torch's HuggingFaceStorageReader computes it.
package hfsharded

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/safetensors"
)

// ShardingInfoKey is the __metadata__ key holding the per-tensor offsets.
const ShardingInfoKey = "DCP_SHARDING_INFO"

var shardName = regexp.MustCompile(`^shard-(\d+)-model-(\d+)-of-(\d+)\.safetensors$`)

// Reader is the HF-sharded safetensors format.
var Reader ckpt.Reader = reader{}

type reader struct{}

func (reader) Format() ckpt.Format { return ckpt.FormatHFSharded }

// Detect reports whether dir holds files named as torch's distributed HF
// writer names them. It looks at names only: a shard that turns out to be
// corrupt is an error of Open, which names it, not a silent "no checkpoint".
func (reader) Detect(dir source.Tree) bool {
	names, err := shardFiles(dir)
	return err == nil && len(names) > 0
}

func (reader) Internal(name string) bool { return IsInternal(name) }

func (reader) Open(dir source.Tree) (*ckpt.Checkpoint, error) { return OpenTree(dir) }

// IsInternal reports whether name is a shard file, which the view replaces.
func IsInternal(name string) bool { return shardName.MatchString(name) }

// shardFiles lists the entries of dir named like shards, sorted by (model
// file index, shard index): regular files and links to them, and whatever
// else bears such a name (a directory, a FIFO, a link leading outside),
// which Open then reports by name rather than as a hole in a tensor.
func shardFiles(dir source.Tree) ([]string, error) {
	entries, err := dir.ReadDir(".")
	if err != nil {
		return nil, err
	}
	type key struct{ model, shard int }
	keys := map[string]key{}
	var names []string
	for _, e := range entries {
		m := shardName.FindStringSubmatch(e.Name)
		if m == nil {
			continue
		}
		shard, _ := strconv.Atoi(m[1])
		model, _ := strconv.Atoi(m[2])
		keys[e.Name] = key{model, shard}
		names = append(names, e.Name)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := keys[names[i]], keys[names[j]]
		if a.model != b.model {
			return a.model < b.model
		}
		return a.shard < b.shard
	})
	return names, nil
}

// OpenTree reads every shard header of dir (eachShard) and builds the
// checkpoint. No tensor data is read.
func OpenTree(dir source.Tree) (*ckpt.Checkpoint, error) {
	names, err := shardFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("hfsharded: %w", err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("hfsharded: %s: no shard-*-model-*.safetensors files", dir.Path("."))
	}
	c := &ckpt.Checkpoint{Dir: dir.Path("."), Format: ckpt.FormatHFSharded, Files: ckpt.NewFileSet(dir),
		FileIndex: map[string]int{}}
	byName := map[string]*ckpt.Tensor{}
	saved := map[string]int{}
	if err := eachShard(c, names, func(name string, sh *shard) error {
		return addShard(c, byName, saved, name, sh)
	}); err != nil {
		c.Close()
		return nil, err
	}
	inSaveOrder(c.Tensors, saved)
	if ckpt.OutOfFileOrder(c.Tensors) {
		// safetensors lays a shard file out by name, not in save order:
		// fills jump around in it, and the kernel's read-ahead read 1.45x
		// the model from disk and left 0.3x of it in the page cache
		// (BENCHMARKS.md, run G).
		c.Files.ReadRandomly()
	}
	if err := loadNeMoFileIndex(c); err != nil {
		c.Close()
		return nil, err
	}
	for _, t := range c.Tensors {
		if err := t.Validate(); err != nil {
			c.Close()
			return nil, fmt.Errorf("hfsharded: %s: %w", c.Dir, err)
		}
	}
	return c, nil
}

// inSaveOrder orders tensors as the writer saved them (their order in
// DCP_SHARDING_INFO, the state dict's), not as the shard files store them
// (sorted by name): the view is laid out in the order a loader builds the
// model, and so reads it. Tensors no sharding info names stay last, in file
// order.
func inSaveOrder(tensors []*ckpt.Tensor, saved map[string]int) {
	pos := func(t *ckpt.Tensor) int {
		if p, ok := saved[t.Name]; ok {
			return p
		}
		return len(saved)
	}
	sort.SliceStable(tensors, func(i, j int) bool { return pos(tensors[i]) < pos(tensors[j]) })
}

// parseShardingInfo decodes DCP_SHARDING_INFO: tensor name → its pieces'
// saved_offsets, with the names in the order the writer listed them. Of a
// name listed twice, the last offsets count, as json.Unmarshal would.
func parseShardingInfo(raw string) (names []string, offsets map[string][]int64, err error) {
	if names, offsets, ok := scanShardingInfo(raw); ok {
		return names, offsets, nil
	}
	return decodeShardingInfo(raw)
}

// scanShardingInfo reads DCP_SHARDING_INFO as torch writes it ({"name":
// {"saved_offsets": [0, 0]}, ...}: names without escapes, non-negative
// integers) with no decoder: with a thousand shards of a thousand pieces,
// encoding/json's reflection and boxing cost more than reading the headers.
// The offsets share one slab. Anything else, valid or not, is not ok and
// goes to decodeShardingInfo, so the result is json.Unmarshal's either way.
func scanShardingInfo(raw string) (names []string, offsets map[string][]int64, ok bool) {
	if !utf8.ValidString(raw) {
		return nil, nil, false
	}
	const field = `"saved_offsets"`
	n := strings.Count(raw, field)
	slab := make([]int64, 0, 2*n)
	offsets = make(map[string][]int64, n)
	i := 0
	ws := func() {
		for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
			i++
		}
	}
	next := func(c byte) bool {
		ws()
		if i < len(raw) && raw[i] == c {
			i++
			return true
		}
		return false
	}
	if !next('{') {
		return nil, nil, false
	}
	if next('}') {
		ws()
		return nil, offsets, i == len(raw)
	}
	for {
		if !next('"') {
			return nil, nil, false
		}
		start := i
		for i < len(raw) && raw[i] != '"' && raw[i] != '\\' && raw[i] >= 0x20 {
			i++
		}
		if i == len(raw) || raw[i] != '"' {
			return nil, nil, false
		}
		name := raw[start:i]
		i++
		if !next(':') || !next('{') {
			return nil, nil, false
		}
		ws()
		if !strings.HasPrefix(raw[i:], field) {
			return nil, nil, false
		}
		i += len(field)
		if !next(':') || !next('[') {
			return nil, nil, false
		}
		first := len(slab)
		if !next(']') {
			for {
				ws()
				d := i
				var v int64
				for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
					if v > (math.MaxInt64-int64(raw[i]-'0'))/10 {
						return nil, nil, false
					}
					v = v*10 + int64(raw[i]-'0')
					i++
				}
				if i == d || (raw[d] == '0' && i-d > 1) {
					return nil, nil, false
				}
				slab = append(slab, v)
				if next(']') {
					break
				}
				if !next(',') {
					return nil, nil, false
				}
			}
		}
		if !next('}') {
			return nil, nil, false
		}
		if _, dup := offsets[name]; !dup {
			names = append(names, name)
		}
		offsets[name] = slab[first:len(slab):len(slab)]
		if next('}') {
			break
		}
		if !next(',') {
			return nil, nil, false
		}
	}
	ws()
	return names, offsets, i == len(raw)
}

// decodeShardingInfo is parseShardingInfo on encoding/json, for every form
// scanShardingInfo does not take.
func decodeShardingInfo(raw string) (names []string, offsets map[string][]int64, err error) {
	dec := json.NewDecoder(strings.NewReader(raw))
	tok, err := dec.Token()
	switch {
	case err != nil:
		return nil, nil, err
	case tok == nil: // null: no offsets, as json.Unmarshal reads it
		return nil, nil, atEnd(dec)
	case tok != json.Delim('{'):
		return nil, nil, fmt.Errorf("not a JSON object")
	}
	offsets = map[string][]int64{}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		var entry struct {
			SavedOffsets []int64 `json:"saved_offsets"`
		}
		if err := dec.Decode(&entry); err != nil {
			return nil, nil, err
		}
		name := key.(string) // object keys are strings
		if _, dup := offsets[name]; !dup {
			names = append(names, name)
		}
		offsets[name] = entry.SavedOffsets
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, err
	}
	return names, offsets, atEnd(dec)
}

// atEnd fails when anything but white space follows the decoded value.
func atEnd(dec *json.Decoder) error {
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("data after the JSON value")
	}
	return nil
}

// shard is one shard file's header, parsed.
type shard struct {
	file    *ckpt.File
	h       *safetensors.Header
	listed  []string           // DCP_SHARDING_INFO's names, in its order
	offsets map[string][]int64 // DCP_SHARDING_INFO
}

// readDepth bounds the headers read at once; window bounds those read
// and not merged yet (their parsed headers are what memory holds).
const (
	readDepth = 8
	window    = 2 * readDepth
)

// eachShard reads and parses every shard's header, readDepth at a time
// and at most window ahead, and calls merge with each in file order: the
// format has no index (torch's writer saves none when it does not
// consolidate), and a tensor's global shape is the largest extent of its
// pieces in all files, so every header is needed to place any byte. On
// storage with a latency per request (object stores, network file
// systems) the reads overlap. Of several bad files, the first in order is
// the one reported.
func eachShard(c *ckpt.Checkpoint, names []string, merge func(name string, sh *shard) error) error {
	type result struct {
		sh  *shard
		err error
	}
	results := make([]chan result, len(names))
	for i := range results {
		results[i] = make(chan result, 1)
	}
	slots := make(chan struct{}, window)
	stop := make(chan struct{})
	var wg sync.WaitGroup // the reads under way: done before the caller may close the files
	defer func() {
		close(stop)
		wg.Wait()
	}()
	wg.Go(func() {
		sem := make(chan struct{}, readDepth)
		for i, name := range names {
			select {
			case slots <- struct{}{}:
			case <-stop:
				return
			}
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				sh, err := readShard(c, name)
				results[i] <- result{sh, err}
			})
		}
	})
	for i, name := range names {
		r := <-results[i]
		<-slots
		if r.err != nil {
			return r.err
		}
		if err := merge(name, r.sh); err != nil {
			return err
		}
	}
	return nil
}

func readShard(c *ckpt.Checkpoint, name string) (*shard, error) {
	file, err := c.Files.Get(name)
	if err != nil {
		return nil, fmt.Errorf("hfsharded: %w", err)
	}
	h, err := safetensors.ReadHeader(file, file.Size())
	if err != nil {
		return nil, fmt.Errorf("hfsharded: %s: %w", file.Path, err)
	}
	sh := &shard{file: file, h: h}
	if raw, ok := h.Metadata[ShardingInfoKey]; ok {
		if sh.listed, sh.offsets, err = parseShardingInfo(raw); err != nil {
			return nil, fmt.Errorf("hfsharded: %s: %s is not valid JSON: %w", file.Path, ShardingInfoKey, err)
		}
	}
	return sh, nil
}

// addShard adds the pieces of one shard file; saved numbers tensor names in
// the order the sharding infos list them (the first listing counts).
func addShard(c *ckpt.Checkpoint, byName map[string]*ckpt.Tensor, saved map[string]int, name string, sh *shard) error {
	file, h, offsets := sh.file, sh.h, sh.offsets
	for _, n := range sh.listed {
		if _, ok := saved[n]; !ok {
			saved[n] = len(saved)
		}
	}
	modelIndex, _ := strconv.Atoi(shardName.FindStringSubmatch(name)[2])
	for _, info := range h.Tensors {
		off := offsets[info.Name]
		if off == nil {
			off = make([]int64, len(info.Shape))
		}
		if len(off) != len(info.Shape) {
			return fmt.Errorf("hfsharded: %s: tensor %q: saved_offsets %v do not match shape %v",
				file.Path, info.Name, off, info.Shape)
		}
		t := byName[info.Name]
		if t == nil {
			t = &ckpt.Tensor{Name: info.Name, DType: info.DType, Shape: make([]int64, len(info.Shape))}
			byName[info.Name] = t
			c.Tensors = append(c.Tensors, t)
			c.FileIndex[info.Name] = modelIndex
		}
		if t.DType != info.DType || len(t.Shape) != len(info.Shape) {
			return fmt.Errorf("hfsharded: %s: tensor %q: %s%v disagrees with other shards (%s, rank %d)",
				file.Path, info.Name, info.DType, info.Shape, t.DType, len(t.Shape))
		}
		for d := range t.Shape {
			if off[d] < 0 || info.Shape[d] > (1<<62)-off[d] {
				return fmt.Errorf("%w: hfsharded: %s: tensor %q: bad saved_offsets %v", ckpt.ErrInvalid, file.Path, info.Name, off)
			}
			t.Shape[d] = max(t.Shape[d], off[d]+info.Shape[d])
		}
		t.Chunks.Append(ckpt.Chunk{
			Offsets: off,
			Sizes:   info.Shape,
			Source:  &ckpt.Section{File: file, Offset: h.DataStart + info.Begin, Length: info.End - info.Begin},
		})
	}
	return nil
}

// FileIndexName is where NeMo AutoModel records the file split of a model.
const FileIndexName = ".hf_metadata/fqn_to_file_index_mapping.json"

// maxFileIndexBytes bounds the file index (one short line per tensor).
const maxFileIndexBytes = 64 << 20

// loadNeMoFileIndex applies NeMo's file index, the split NeMo AutoModel
// records, over the split the file names imply.
func loadNeMoFileIndex(c *ckpt.Checkpoint) error {
	tree := c.Files.Tree()
	if _, err := tree.Stat(FileIndexName); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	data, err := source.ReadFile(tree, FileIndexName, maxFileIndexBytes)
	if err != nil {
		return fmt.Errorf("hfsharded: %w", err)
	}
	m, err := parseFileIndex(data)
	if err != nil {
		return fmt.Errorf("hfsharded: %s: %w", tree.Path(FileIndexName), err)
	}
	for k, v := range m {
		c.FileIndex[k] = v
	}
	return nil
}
