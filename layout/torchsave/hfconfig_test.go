package torchsave

import (
	"bytes"
	"encoding/json"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/pickle"
)

// pdict builds a decoded dict of key, value pairs.
func pdict(t testing.TB, kv ...any) *pickle.Dict {
	d := &pickle.Dict{}
	for i := 0; i < len(kv); i += 2 {
		require.NoError(t, d.Set(kv[i], kv[i+1]))
	}
	return d
}

// composerState is data.pkl of a Composer checkpoint holding cfg as its HF
// config.
func composerState(t testing.TB, ext string, content any) *pickle.Dict {
	cfg := pdict(t, "file_extension", ext, "content", content)
	hf := pdict(t, "model", pdict(t, "config", cfg, "class", "transformers.LlamaForCausalLM"))
	return pdict(t, "state", pdict(t, "model", pdict(t), "integrations", pdict(t, "huggingface", hf)), "rng", &pickle.List{})
}

// TestEmbeddedConfig: Composer's HF config, a dict of JSON values, written
// back as the JSON transformers reads to the same values (key order kept,
// an integral float still a float); anything else in its place is an error
// naming where, and a checkpoint without one has none.
func TestEmbeddedConfig(t *testing.T) {
	content := pdict(t, "model_type", "llama", "hidden_size", int64(32), "rms_norm_eps", 1e-5, "rope_theta", 10000.0,
		"tie_word_embeddings", false, "pad_token_id", nil, "architectures", &pickle.List{Items: []any{"LlamaForCausalLM"}},
		"rope_parameters", pdict(t, "rope_type", "default"), "big", new(big.Int).Lsh(big.NewInt(1), 70), "q", "a\"b\n")
	b, err := embeddedConfig(composerState(t, ".json", content))
	require.NoError(t, err)
	assert.Equal(t, `{"model_type": "llama", "hidden_size": 32, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, `+
		`"tie_word_embeddings": false, "pad_token_id": null, "architectures": ["LlamaForCausalLM"], `+
		`"rope_parameters": {"rope_type": "default"}, "big": 1180591620717411303424, "q": "a\"b\n"}`+"\n", string(b))
	var back map[string]any
	require.NoError(t, json.Unmarshal(b, &back))

	b, err = embeddedConfig(pdict(t, "state_dict", pdict(t)))
	require.NoError(t, err)
	assert.Nil(t, b, "no Composer state: no config")
	b, err = embeddedConfig(pdict(t, "state", pdict(t, "integrations", "x")))
	require.NoError(t, err)
	assert.Nil(t, b, "no huggingface integration: no config")

	deep := any(int64(1))
	for range maxConfigDepth + 2 {
		deep = &pickle.List{Items: []any{deep}}
	}
	huge := &pickle.List{}
	for range 1 << 15 {
		huge.Items = append(huge.Items, "0123456789abcdef0123456789abcdef0123456789")
	}
	for _, tc := range []struct {
		name string
		v    any
		err  string
	}{
		{"config not a dict", pdict(t, "state", pdict(t, "integrations", pdict(t, "huggingface", pdict(t, "model", pdict(t, "config", "x"))))),
			`data.pkl["state"]["integrations"]["huggingface"]["model"]["config"] is str, not a dict`},
		{"not a .json", composerState(t, ".yaml", pdict(t)), `holds a ".yaml" file, not a .json config`},
		{"content not a dict", composerState(t, ".json", &pickle.List{}), `["content"] is list, not a dict`},
		{"NaN", composerState(t, ".json", pdict(t, "x", math.NaN())), `"x": NaN has no JSON form`},
		{"Inf", composerState(t, ".json", pdict(t, "x", math.Inf(1))), `"x": +Inf has no JSON form`},
		{"an int key", composerState(t, ".json", pdict(t, int64(1), "x")), "a int key, not a str"},
		{"an object", composerState(t, ".json", pdict(t, "dtype", &pickle.Object{Class: pickle.Global{Module: "torch", Name: "float32"}})),
			`"dtype": torch.float32(...) has no JSON form`},
		{"bytes", composerState(t, ".json", pdict(t, "b", []byte("x"))), `"b": bytes has no JSON form`},
		{"too deep", composerState(t, ".json", pdict(t, "d", deep)), "nested deeper than 32"},
		{"too large", composerState(t, ".json", pdict(t, "h", huge)), "larger than 1 MiB as JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := embeddedConfig(tc.v)
			require.ErrorContains(t, err, tc.err)
		})
	}
}

// TestStateDictLinkedTwice: two names of one file (Composer's
// latest-rank0.pt links to the checkpoint it saved last) are one state
// dict, not two.
func TestStateDictLinkedTwice(t *testing.T) {
	dir := t.TempDir()
	src := treetest.Testdata("torchsave_statedict_flat", "ckpt", "model.pt")
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ep0-ba1-rank0.pt"), b, 0o644))
	require.NoError(t, os.Symlink("ep0-ba1-rank0.pt", filepath.Join(dir, "latest-rank0.pt")))
	c, err := openState(dir)
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, ckpt.FormatTorchStateDict, c.Format)
	assert.Nil(t, c.HFConfig)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "copy.pt"), b, 0o644))
	_, err = openState(dir)
	require.ErrorContains(t, err, "2 torch.save state dicts (copy.pt, ep0-ba1-rank0.pt)")
}

// item is a DCP object of value pkl (a pickle), a torch.save archive, saved
// at path.
func item(t testing.TB, pkl string, path ...string) ckpt.Object {
	b := zipOf(t, entry{name: "archive/data.pkl", data: []byte("\x80\x02" + pkl + ".")},
		entry{name: "archive/version", data: []byte("3\n")})
	return ckpt.Object{Name: strings.Join(path, "."), Path: path, Size: int64(len(b)), Source: "__0_0.distcp@0",
		Bytes: bytes.NewReader(b)}
}

// TestObjectsConfig: Composer's config as DCP saves it, one item per leaf,
// put back together by the items' saved nesting; items of a malformed
// config are an error naming the item, and a checkpoint without one has no
// config.
func TestObjectsConfig(t *testing.T) {
	at := func(p ...string) []string { return append(slices.Clone(composerConfigPath), p...) }
	objs := []ckpt.Object{
		item(t, pstr("x"), "state", "timestamp"),
		item(t, pstr(".json"), at("file_extension")...),
		item(t, pstr("llama"), at("content", "model_type")...),
		item(t, pint(32), at("content", "hidden_size")...),
		item(t, pstr("default"), at("content", "rope_parameters", "rope_type")...),
		item(t, "\x89", at("content", "tie_word_embeddings")...),
	}
	b, err := ObjectsConfig(objs)
	require.NoError(t, err)
	assert.Equal(t, `{"model_type": "llama", "hidden_size": 32, "rope_parameters": {"rope_type": "default"}, "tie_word_embeddings": false}`+"\n", string(b))

	b, err = ObjectsConfig(objs[:1])
	require.NoError(t, err)
	assert.Nil(t, b)

	compressed := item(t, pstr("y"), at("content", "z")...)
	compressed.Bytes = nil
	big := item(t, pstr(strings.Repeat("y", maxConfigObject)), at("content", "z")...)
	for _, tc := range []struct {
		name string
		objs []ckpt.Object
		err  string
	}{
		{"a leaf and a dict", append(slices.Clone(objs), item(t, pint(1), at("content", "hidden_size", "x")...)),
			"state.integrations.huggingface.model.config.content.hidden_size is a value and a dict"},
		{"saved twice", append(slices.Clone(objs), objs[2]), "model_type is saved twice"},
		{"compressed", append(slices.Clone(objs), compressed), "stored compressed, not a plain item"},
		{"too large", append(slices.Clone(objs), big), "more than the 65536 a config value takes"},
		{"not an archive", append(slices.Clone(objs), ckpt.Object{Name: "n", Path: at("content", "n"), Size: 3, Bytes: bytes.NewReader([]byte("abc"))}),
			"n ("},
		{"no extension", objs[2:], `holds a "" file, not a .json config`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ObjectsConfig(tc.objs)
			require.ErrorContains(t, err, tc.err)
		})
	}
}

// FuzzObjectsConfig decodes an arbitrary item as a leaf of Composer's
// config, and an arbitrary data.pkl as a monolithic checkpoint's: errors,
// never a panic, a hang or an allocation beyond the bounds.
func FuzzObjectsConfig(f *testing.F) {
	f.Add(zipOf(f, entry{name: "a/data.pkl", data: []byte("\x80\x02" + pstr("x") + ".")}), []byte("\x80\x02}."))
	f.Add(zipOf(f, entry{name: "a/data.pkl", data: []byte("\x80\x02G\x7f\xf8\x00\x00\x00\x00\x00\x00.")}),
		dict(pstr("state")+"}("+pstr("integrations")+"}("+pstr("huggingface")+"}("+pstr("model")+"}("+pstr("config")+
			"}("+pstr("file_extension")+pstr(".json")+pstr("content")+"}("+pstr("a")+"]("+pint(1)+"NI01\n"+"eu"+"uuuuu"))
	f.Fuzz(func(t *testing.T, leaf, pkl []byte) {
		path := append(slices.Clone(composerConfigPath), "content", "x")
		ext := append(slices.Clone(composerConfigPath), "file_extension")
		e := item(t, pstr(".json"), ext...)
		_, _ = ObjectsConfig([]ckpt.Object{e, {Name: "x", Path: path, Size: int64(len(leaf)), Bytes: bytes.NewReader(leaf)}})
		if v, err := pickle.DecodeBytes(pkl, pickle.Options{MaxInputBytes: 1 << 16, MaxStringLen: 1 << 12, MaxItems: 1 << 12,
			MaxDepth: 64, MaxStack: 1 << 10, MaxMemo: 1 << 12}); err == nil {
			_, _ = embeddedConfig(v)
		}
	})
}
