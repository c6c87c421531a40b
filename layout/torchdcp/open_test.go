package torchdcp

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/safetensors"
)

func TestDetect(t *testing.T) {
	tree, err := source.OpenLocal("testdata")
	require.NoError(t, err)
	defer tree.Close()
	plain, err := source.Sub(tree, "plain")
	require.NoError(t, err)
	assert.True(t, Detect(plain))
	assert.False(t, Detect(tree))
	nope, err := source.Sub(tree, "nope")
	require.NoError(t, err)
	assert.False(t, Detect(nope))
}

func TestOpenFixtures(t *testing.T) {
	man := loadManifest(t)
	for _, name := range checkpoints {
		t.Run(name, func(t *testing.T) {
			want := man.ckpt(t, name)
			dir := filepath.Join("testdata", name)
			c, err := Open(dir)
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			assert.Equal(t, ckpt.FormatTorchDCP, c.Format)
			assert.Equal(t, dir, c.Dir)

			byName := map[string]*ckpt.Tensor{}
			var names []string
			for _, tn := range c.Tensors {
				byName[tn.Name] = tn
				names = append(names, tn.Name)
			}
			var wantNames []string
			for _, wt := range want.Tensors {
				if wt.DType == "complex128" {
					continue
				}
				wantNames = append(wantNames, wt.FQN)
			}
			assert.Equal(t, wantNames, names, "tensors in .metadata order, unservable ones left out")

			for _, wt := range want.Tensors {
				t.Run(wt.FQN, func(t *testing.T) {
					tn := byName[wt.FQN]
					if wt.DType == "complex128" {
						assert.Nil(t, tn)
						assert.Contains(t, c.Skipped, ckpt.Skipped{Name: wt.FQN, Reason: "dtype complex128 has no safetensors equivalent"})
						return
					}
					require.NotNil(t, tn)
					dt, ok := safetensors.FromTorch(wt.DType)
					require.True(t, ok)
					assert.Equal(t, dt, tn.DType)
					assert.Equal(t, wt.Shape, nonNil(tn.Shape))
					assert.Equal(t, wt.Path, tn.Path)
					require.Equal(t, len(wt.Chunks), tn.Chunks.Len())
					assert.Equal(t, unhex(t, wt.Hex), assemble(t, tn))
				})
			}

			var objs []string
			for i, o := range c.Objects {
				objs = append(objs, o.Name)
				assert.Equal(t, want.Objects[i].Path, o.Path)
				assert.Positive(t, o.Size)
				assert.Contains(t, o.Source, ".distcp@")
			}
			var wantObjs []string
			for _, o := range want.Objects {
				wantObjs = append(wantObjs, o.FQN)
			}
			assert.Equal(t, wantObjs, objs)
		})
	}
}

func TestOpenIsLazy(t *testing.T) {
	// Open reads no shard bytes: a shard whose records are all garbage (but
	// of the right size) opens fine, and its chunks fail on first read.
	dir := copyDir(t, "plain")
	p := filepath.Join(dir, "__0_0.distcp")
	fi, err := os.Stat(p)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, make([]byte, fi.Size()), 0o644))

	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	tn := c.Tensors[0]
	_, err = treetest.ReadChunk(t, tn, tn.Chunks.At(0))
	require.ErrorContains(t, err, "torchdcp: "+p+"@", "names the shard by its full path")
	assert.ErrorContains(t, err, `tensor "f32" chunk (0,0): not a torch.save zip archive`)
	assert.ErrorIs(t, err, ckpt.ErrInvalid)
	// The error is remembered.
	_, err2 := treetest.ReadChunk(t, tn, tn.Chunks.At(0))
	assert.Equal(t, err, err2)
}

func TestReadAtEdges(t *testing.T) {
	c, err := Open(filepath.Join("testdata", "plain"))
	require.NoError(t, err)
	defer c.Close()
	man := loadManifest(t).ckpt(t, "plain")
	var f32 *ckpt.Tensor
	for _, tn := range c.Tensors {
		if tn.Name == "f32" {
			f32 = tn
		}
	}
	require.NotNil(t, f32)
	want := unhex(t, man.Tensors[0].Hex)
	src := f32.Chunks.At(0).Source
	assert.Contains(t, src.String(), "__0_0.distcp@")

	buf := make([]byte, 10)
	n, err := src.ReadAt(buf, 40)
	assert.Equal(t, 8, n)
	assert.Equal(t, io.EOF, err)
	assert.Equal(t, want[40:48], buf[:n])

	n, err = src.ReadAt(buf, 48)
	assert.Equal(t, 0, n)
	assert.Equal(t, io.EOF, err)

	_, err = src.ReadAt(buf, 49)
	assert.ErrorContains(t, err, "outside chunk of 48 bytes")

	// Concurrent first reads resolve once and agree.
	var wg sync.WaitGroup
	c2, err := Open(filepath.Join("testdata", "zstd"))
	require.NoError(t, err)
	defer c2.Close()
	for _, tn := range c2.Tensors {
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				assemble(t, tn)
			}()
		}
	}
	wg.Wait()
}

func TestOpenZstdSpill(t *testing.T) {
	// Records larger than memRecordLimit decompress into an unlinked
	// temporary file: nothing is left in TempDir, and the bytes are right.
	defer func(v int64) { memRecordLimit = v }(memRecordLimit)
	memRecordLimit = 100
	man := loadManifest(t).ckpt(t, "zstd")
	tmp := t.TempDir()
	c, err := OpenWith(filepath.Join("testdata", "zstd"), Options{TempDir: tmp})
	require.NoError(t, err)
	defer c.Close()
	for i, tn := range c.Tensors {
		assert.Equal(t, unhex(t, man.Tensors[i].Hex), assemble(t, tn), tn.Name)
		assert.IsType(t, &os.File{}, tn.Chunks.At(0).Source.(*recordSource).loc.Load().rest.r, "%s spooled to a file", tn.Name)
	}
	ents, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, ents)
}

// mdMutation breaks decoded metadata before build.
type mdMutation func(t *testing.T, m *Metadata)

func findItem(t *testing.T, m *Metadata, fqn string) *TensorMetadata {
	for _, it := range m.Items {
		if it.FQN == fqn {
			require.NotNil(t, it.Tensor)
			return it.Tensor
		}
	}
	t.Fatalf("no item %q", fqn)
	return nil
}

func setStorage(m *Metadata, fqn string, f func(*StorageInfo)) {
	for i := range m.Storage {
		if m.Storage[i].Index.FQN == fqn {
			f(&m.Storage[i].Info)
		}
	}
}

func TestOpenBad(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fixture  string
		files    func(t *testing.T, dir string) // breaks files on disk
		md       mdMutation                     // breaks decoded metadata
		openErr  string                         // error at Open
		readErr  string                         // else: error at first read of tensor readFQN
		readFQN  string
		notExist bool
	}{
		{
			name: "missing shard", fixture: "sharded",
			files:   func(t *testing.T, dir string) { require.NoError(t, os.Remove(filepath.Join(dir, "__1_0.distcp"))) },
			openErr: `: tensor "rows": chunk (3,0): stat `, notExist: true,
		},
		{
			name: "missing .metadata", fixture: "plain",
			files:   func(t *testing.T, dir string) { require.NoError(t, os.Remove(filepath.Join(dir, MetadataFile))) },
			openErr: "torchdcp: open ", notExist: true,
		},
		{
			name: "truncated shard", fixture: "sharded",
			files: func(t *testing.T, dir string) {
				require.NoError(t, os.Truncate(filepath.Join(dir, "__1_0.distcp"), 1000))
			},
			openErr: `.metadata: tensor "rows": chunk (3,0) stored in __1_0.distcp@`,
		},
		{
			name: "truncated shard message", fixture: "sharded",
			files: func(t *testing.T, dir string) {
				require.NoError(t, os.Truncate(filepath.Join(dir, "__1_0.distcp"), 1000))
			},
			openErr: `past end of file (size 1000)`,
		},
		{
			name: "shard is a directory", fixture: "plain",
			files: func(t *testing.T, dir string) {
				require.NoError(t, os.Remove(filepath.Join(dir, "__0_0.distcp")))
				require.NoError(t, os.Mkdir(filepath.Join(dir, "__0_0.distcp"), 0o755))
			},
			openErr: "is not a regular file",
		},
		{
			name: "relative_path with ../ (pickle bytes)", fixture: "plain",
			files: func(t *testing.T, dir string) {
				require.NoError(t, os.WriteFile(filepath.Join(dir, MetadataFile), mutate(t, "__0_0.distcp", "../_0.distcp"), 0o644))
			},
			openErr: `"../_0.distcp" escapes the checkpoint directory`,
		},
		{
			name: "absolute relative_path", fixture: "plain",
			md: func(t *testing.T, m *Metadata) {
				setStorage(m, "f32", func(i *StorageInfo) { i.RelativePath = "/etc/passwd" })
			},
			openErr: `tensor "f32": chunk (0,0): ckpt: invalid checkpoint: file path "/etc/passwd" is not relative`,
		},
		{
			name: "corrupt pickle", fixture: "plain",
			files: func(t *testing.T, dir string) {
				p := filepath.Join(dir, MetadataFile)
				b, err := os.ReadFile(p)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(p, b[:len(b)-100], 0o644))
			},
			openErr: "/.metadata: pickle: truncated input",
		},
		{
			name: "hole in chunks", fixture: "sharded",
			md: func(t *testing.T, m *Metadata) {
				findItem(t, m, "rows").Chunks[1].Sizes = []int64{1, 3}
			},
			openErr: `tensor "rows": chunks cover 12 of 15 elements (hole in chunk coverage)`,
		},
		{
			name: "overlapping chunks", fixture: "sharded",
			md: func(t *testing.T, m *Metadata) {
				tm := findItem(t, m, "cols")
				tm.Chunks[1].Offsets = []int64{0, 2}
			},
			openErr: `tensor "cols": chunks 0 and 1 overlap`,
		},
		{
			name: "chunk out of bounds", fixture: "sharded",
			md: func(t *testing.T, m *Metadata) {
				findItem(t, m, "rows").Chunks[1].Offsets = []int64{4, 0}
			},
			openErr: `tensor "rows": chunk 1 (offsets [4 0] sizes [2 3]) is outside shape [5 3]`,
		},
		{
			name: "missing storage entry", fixture: "sharded",
			md: func(t *testing.T, m *Metadata) {
				findItem(t, m, "cols").Chunks[1].Offsets = []int64{0, 5}
				findItem(t, m, "cols").Chunks[1].Sizes = []int64{2, 3}
				findItem(t, m, "cols").Chunks[0].Sizes = []int64{2, 5}
			},
			openErr: `tensor "cols": chunk (0,5) has no storage_data entry`,
		},
		{
			name: "missing object storage", fixture: "plain",
			md: func(t *testing.T, m *Metadata) {
				for i := range m.Storage {
					if m.Storage[i].Index.FQN == "step" {
						m.Storage[i].Index.FQN = "gone"
					}
				}
				m.storage = map[string]int{}
				for i, e := range m.Storage {
					m.storage[e.Index.Key()] = i
				}
			},
			openErr: `object "step" has no storage_data entry`,
		},
		{
			name: "unknown transform", fixture: "plain",
			md: func(t *testing.T, m *Metadata) {
				setStorage(m, "bf16", func(i *StorageInfo) { i.TransformDescriptors = []string{"stream.gzip/1"} })
			},
			openErr: `tensor "bf16": chunk (0,0): unsupported transform_descriptors ["stream.gzip/1"]`,
		},
		{
			name: "zstd version 2", fixture: "zstd",
			md: func(t *testing.T, m *Metadata) {
				setStorage(m, "extra", func(i *StorageInfo) { i.TransformDescriptors = []string{"stream.zstd/2"} })
			},
			openErr: `object "extra": unsupported transform_descriptors ["stream.zstd/2"]`,
		},
		{
			name: "negative offset", fixture: "plain",
			md: func(t *testing.T, m *Metadata) {
				setStorage(m, "i8", func(i *StorageInfo) { i.Offset = -1 })
			},
			openErr: `tensor "i8": chunk (0) stored in __0_0.distcp@-1+`,
		},
		{
			name: "offset past end", fixture: "plain",
			md: func(t *testing.T, m *Metadata) {
				setStorage(m, "i8", func(i *StorageInfo) { i.Offset = 1 << 62; i.Length = 1 << 62 })
			},
			openErr: `past end of file (size 32993)`,
		},
		{
			name: "record too short", fixture: "plain",
			md: func(t *testing.T, m *Metadata) {
				setStorage(m, "f32", func(i *StorageInfo) { i.Length = 40 })
			},
			openErr: `tensor "f32": chunk (0,0) stored in __0_0.distcp@`,
		},
		{
			name: "record bytes corrupted", fixture: "plain",
			files: func(t *testing.T, dir string) {
				m, err := decodeFile(t, filepath.Join(dir, MetadataFile))
				require.NoError(t, err)
				info, ok := m.Lookup("i16", []int64{0})
				require.True(t, ok)
				f, err := os.OpenFile(filepath.Join(dir, info.RelativePath), os.O_RDWR, 0)
				require.NoError(t, err)
				defer f.Close()
				// Clobber the first local header.
				_, err = f.WriteAt([]byte("XXXX"), info.Offset)
				require.NoError(t, err)
			},
			readFQN: "i16", readErr: `tensor "i16" chunk (0): archive/data.pkl: zip: not a valid zip file`,
		},
		{
			name: "dtype mismatch", fixture: "plain",
			md: func(t *testing.T, m *Metadata) {
				findItem(t, m, "f32").Properties.DType = "int32"
			},
			readFQN: "f32", readErr: "record holds dtype float32, metadata says int32",
		},
		{
			name: "a dtype torch does not have", fixture: "sharded",
			md: func(t *testing.T, m *Metadata) {
				for _, it := range m.Items {
					if it.Tensor != nil {
						it.Tensor.Properties.DType = "bfloat99"
					}
				}
			},
			openErr: `tensors have a dtype torch does not have: "rows" (torch.bfloat99), "cols" (torch.bfloat99)`,
		},
		{
			name: "shape mismatch", fixture: "plain",
			md: func(t *testing.T, m *Metadata) {
				tm := findItem(t, m, "i64")
				tm.Size = []int64{5}
				tm.Chunks[0].Sizes = []int64{5}
			},
			readFQN: "i64", readErr: "record holds shape [10], chunk sizes are [5]",
		},
		{
			name: "zstd record truncated", fixture: "zstd",
			md: func(t *testing.T, m *Metadata) {
				setStorage(m, "model.l1.weight", func(i *StorageInfo) { i.Length -= 20 })
			},
			readFQN: "model.l1.weight", readErr: `tensor "model.l1.weight" chunk (0,0): zstd: `,
		},
		{
			name: "zstd record is not zstd", fixture: "plain",
			md: func(t *testing.T, m *Metadata) {
				setStorage(m, "f32", func(i *StorageInfo) { i.TransformDescriptors = []string{"stream.zstd/1"} })
			},
			readFQN: "f32", readErr: `(zstd): tensor "f32" chunk (0,0): zstd: `,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyDir(t, tc.fixture)
			if tc.files != nil {
				tc.files(t, dir)
			}
			var c *ckpt.Checkpoint
			var err error
			if tc.md != nil {
				m, derr := decodeFile(t, filepath.Join(dir, MetadataFile))
				require.NoError(t, derr)
				tc.md(t, m)
				tree, terr := source.OpenLocal(dir)
				require.NoError(t, terr)
				t.Cleanup(func() { tree.Close() })
				c, err = OpenDecoded(tree, m, Options{})
			} else {
				c, err = Open(dir)
			}
			if tc.openErr != "" {
				require.Error(t, err)
				assert.ErrorContains(t, err, tc.openErr)
				assert.True(t, strings.HasPrefix(err.Error(), "torchdcp: "), err.Error())
				if tc.notExist {
					assert.ErrorIs(t, err, fs.ErrNotExist)
				} else {
					assert.ErrorIs(t, err, ckpt.ErrInvalid)
				}
				return
			}
			require.NoError(t, err)
			defer c.Close()
			for _, tn := range c.Tensors {
				if tn.Name != tc.readFQN {
					continue
				}
				_, err := treetest.ReadChunk(t, tn, tn.Chunks.At(0))
				require.Error(t, err)
				assert.ErrorContains(t, err, tc.readErr)
				assert.True(t, strings.HasPrefix(err.Error(), "torchdcp: "), err.Error())
				assert.True(t, errors.Is(err, ckpt.ErrInvalid), "%v is ErrInvalid", err)
				return
			}
			t.Fatalf("no tensor %q", tc.readFQN)
		})
	}
}

func TestSourceChangedAfterOpen(t *testing.T) {
	dir := copyDir(t, "plain")
	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	p := filepath.Join(dir, "__0_0.distcp")
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, append(b, 0), 0o644))
	tn := c.Tensors[0]
	_, err = treetest.ReadChunk(t, tn, tn.Chunks.At(0))
	require.ErrorIs(t, err, ckpt.ErrSourceChanged)
	assert.ErrorContains(t, err, `tensor "f32" chunk (0,0)`)
}

// TestOpenDecodedIsOpenTree: a checkpoint built from metadata decoded
// already (a writer's own) is the one OpenTree reads: the same tensors,
// chunks and bytes.
func TestOpenDecodedIsOpenTree(t *testing.T) {
	for _, name := range checkpoints {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", name)
			want, err := Open(dir)
			require.NoError(t, err)
			defer want.Close()
			b, err := os.ReadFile(filepath.Join(dir, MetadataFile))
			require.NoError(t, err)
			m, err := DecodeMetadata(bytes.NewReader(b))
			require.NoError(t, err)
			got, err := treetest.OpenLocal(dir, func(tree source.Tree) (*ckpt.Checkpoint, error) {
				return OpenDecoded(tree, m, Options{})
			})
			require.NoError(t, err)
			defer got.Close()
			assert.Equal(t, want.Format, got.Format)
			assert.Equal(t, want.ModTime, got.ModTime)
			require.Len(t, got.Tensors, len(want.Tensors))
			for i, wt := range want.Tensors {
				gt := got.Tensors[i]
				assert.Equal(t, wt.Name, gt.Name)
				assert.Equal(t, wt.Shape, gt.Shape)
				require.Equal(t, wt.Chunks.Len(), gt.Chunks.Len(), wt.Name)
				for j := range wt.Chunks.Len() {
					wb, err := treetest.ReadChunk(t, wt, wt.Chunks.At(j))
					require.NoError(t, err)
					gb, err := treetest.ReadChunk(t, gt, gt.Chunks.At(j))
					require.NoError(t, err)
					assert.True(t, bytes.Equal(wb, gb), "%s chunk %d", wt.Name, j)
				}
			}
		})
	}
}
