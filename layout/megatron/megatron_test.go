package megatron

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/torchzip/ziptest"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
)

const fixtures = "../torchdcp/testdata"

// megatronDir builds a Megatron-style checkpoint from the torchdcp plain
// fixture: its shards, the MCoreMetadata re-pickle as .metadata, and
// metadata.json.
func megatronDir(t *testing.T, config string) string {
	t.Helper()
	dir := t.TempDir()
	copyFile := func(src, dst string) {
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, dst), b, 0o644))
	}
	copyFile(filepath.Join(fixtures, "plain", "__0_0.distcp"), "__0_0.distcp")
	copyFile(filepath.Join(fixtures, "plain_mcore.metadata"), ".metadata")
	if config != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), []byte(config), 0o644))
	}
	return dir
}

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		want         bool
	}{
		{"old config", `{"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", "common_backend_version": 1}`, true},
		{"new config", `{"sharded_backend": "torch_dist", "sharded_backend_version": 1}`, true},
		{"zarr (Open says it is unsupported)", `{"sharded_backend": "zarr", "sharded_backend_version": 1}`, true},
		{"KempnerForge", `{"step": 3, "tokens_seen": 100}`, false},
		{"not json", `sharded_backend torch_dist`, false},
		{"no metadata.json", ``, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, treetest.Detect(t, Reader, megatronDir(t, tc.config)))
		})
	}
}

func TestOpen(t *testing.T) {
	dir := megatronDir(t, `{"sharded_backend": "torch_dist", "sharded_backend_version": 1}`)
	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, ckpt.FormatMegatron, c.Format)

	ref, err := treetest.OpenLocal(filepath.Join(fixtures, "plain"), torchdcp.Reader.Open)
	require.NoError(t, err)
	defer ref.Close()
	require.Equal(t, len(ref.Tensors), len(c.Tensors))
	for i, tn := range c.Tensors {
		assert.Equal(t, ref.Tensors[i].Name, tn.Name, "keys stay as stored")
		assert.Equal(t, ref.Tensors[i].Shape, tn.Shape)
		assert.Equal(t, read(t, ref.Tensors[i]), read(t, tn), tn.Name)
	}
	require.Equal(t, len(ref.Objects), len(c.Objects))
	for i, o := range c.Objects {
		want := ref.Objects[i]
		assert.Equal(t, []any{want.Name, want.Path, want.Size, want.Source}, []any{o.Name, o.Path, o.Size, o.Source})
		assert.Equal(t, readObject(t, want), readObject(t, o), o.Name)
	}
	assert.Equal(t, ref.Skipped, c.Skipped)

	_, err = Open(megatronDir(t, `{"sharded_backend": "zarr"}`))
	assert.ErrorContains(t, err, `sharded backend "zarr" is not supported`)
	_, err = Open(megatronDir(t, ""))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func read(t *testing.T, tn *ckpt.Tensor) []byte {
	t.Helper()
	var out []byte
	for _, c := range tn.Chunks.All() {
		buf, err := treetest.ReadChunk(t, tn, c)
		require.NoError(t, err)
		out = append(out, buf...)
	}
	return out
}

// TestMegatronCoreFixture opens the checkpoint megatron-core 0.16.1 itself
// wrote (testdata/megatron; its bytes are compared with the original tensors
// by layout's TestExportMatchesOriginals).
func TestMegatronCoreFixture(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "megatron", "ckpt")
	require.True(t, treetest.Detect(t, Reader, dir))
	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, ckpt.FormatMegatron, c.Format)
	var names []string
	for _, tn := range c.Tensors {
		require.NoError(t, tn.Validate())
		names = append(names, tn.Name)
	}
	assert.Contains(t, names, "decoder.layers.mlp.linear_fc1.weight", "keys stay Megatron's")
	assert.NotEmpty(t, c.Objects, "ShardedObjects are listed")
}

// The arguments Megatron-LM's trainer stores in common.pt, read without
// executing anything (fixture written through megatron-core's own save).
func TestReadArgs(t *testing.T) {
	tree, err := source.OpenLocal(filepath.Join("..", "..", "testdata", "megatron_gpt_llama_tp2", "ckpt", "iter_0000010"))
	require.NoError(t, err)
	defer tree.Close()
	args, err := ReadArgs(tree)
	require.NoError(t, err)
	assert.Equal(t, int64(4), args["num_attention_heads"])
	assert.Equal(t, int64(2), args["num_query_groups"])
	assert.Equal(t, int64(12), args["kv_channels"])
	assert.Equal(t, int64(128), args["padded_vocab_size"])
	assert.Equal(t, true, args["group_query_attention"])
	assert.Equal(t, "RMSNorm", args["normalization"])
	assert.Equal(t, 1e-05, args["norm_epsilon"])
	assert.Nil(t, args["vocab_size"])

	// No common.pt: no arguments, no error.
	empty, err := source.OpenLocal(t.TempDir())
	require.NoError(t, err)
	defer empty.Close()
	args, err = ReadArgs(empty)
	require.NoError(t, err)
	assert.Nil(t, args)
}

// megatron-core 0.17+ keeps the common state in the DCP files
// (common_state/shard_0_1 = torch.save([common])), not in common.pt: the
// same model saved by 0.19.2 records the same args as by 0.16.1.
func TestCommonStateArgs(t *testing.T) {
	old, err := Open(filepath.Join("..", "..", "testdata", "megatron_gpt_llama_tp2", "ckpt", "iter_0000010"))
	require.NoError(t, err)
	defer old.Close()
	cur, err := Open(filepath.Join("..", "..", "testdata", "megatron_gpt_llama_tp2_mcore019", "ckpt", "iter_0000010"))
	require.NoError(t, err)
	defer cur.Close()
	assert.Empty(t, cur.Warnings)
	require.NotEmpty(t, old.Record)
	assert.Equal(t, old.Record, cur.Record)
	assert.Equal(t, int64(4), cur.Record.(Args)["num_attention_heads"])

	args, err := CommonStateArgs(old)
	require.NoError(t, err)
	assert.Nil(t, args, "no common_state object: no args, no error")
}

func readObject(t *testing.T, o ckpt.Object) []byte {
	t.Helper()
	require.NotNil(t, o.Bytes, o.Name)
	b := make([]byte, o.Size)
	require.NoError(t, source.ReadFullAt(o.Bytes, b, 0), o.Name)
	return b
}

// Megatron's own metadata.json is not an HF file: views do not show it.
func TestInternal(t *testing.T) {
	for name, want := range map[string]bool{
		ConfigFile: true, CommonFile: true, ".metadata": true, "__0_0.distcp": true,
		"config.json": false, "tokenizer.json": false,
	} {
		assert.Equal(t, want, Reader.Internal(name), name)
	}
}

// common_state must be a list of exactly the common dict; common.pt is the
// dict itself.
func TestCommonArgsShape(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "megatron_gpt_llama_tp2", "ckpt", "iter_0000010", CommonFile))
	require.NoError(t, err)
	_, err = commonArgs(bytes.NewReader(b), int64(len(b)), true)
	assert.ErrorContains(t, err, "not a list of one common state")
	args, err := commonArgs(bytes.NewReader(b), int64(len(b)), false)
	require.NoError(t, err)
	assert.Equal(t, int64(2), args["num_query_groups"])
	_, err = commonArgs(bytes.NewReader(b), maxCommonBytes+1, false)
	assert.ErrorContains(t, err, "larger than")
	// The common state is opened as every torch.save archive is
	// (torchzip.Open): a compressed entry is refused here too.
	z := ziptest.Deflate(t, b, "/data.pkl")
	_, err = commonArgs(bytes.NewReader(z), int64(len(z)), false)
	assert.ErrorContains(t, err, "data.pkl is compressed")
}
