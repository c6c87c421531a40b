package torchsave

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/sttest"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

// openState opens the state dict of the local directory dir.
func openState(dir string) (*ckpt.Checkpoint, error) { return treetest.OpenLocal(dir, OpenStateDict) }

// TestStateDictFixtures: torch.save state dicts written by torch under
// other names than pytorch_model.bin are recognised by what they hold;
// the model's tensors are byte for byte save_pretrained's, a nested file's
// tensors keep their saved nesting (which the view selects by), a flat
// file's record none, and a tied alias is left out as save_pretrained
// leaves it.
func TestStateDictFixtures(t *testing.T) {
	for _, tc := range []struct {
		name, file, prefix string
		optimizer          int
		skipped            []string
	}{
		{"torchsave_statedict_flat", "model.pt", "", 0, []string{"lm_head.weight"}},
		{"torchsave_statedict_nested", "checkpoint.pth", "model_state_dict.", 63, nil}, // 21 parameters × (step, exp_avg, exp_avg_sq)
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := treetest.Testdata(tc.name, "ckpt")
			require.True(t, treetest.Detect(t, StateDictReader, dir))
			require.False(t, treetest.Detect(t, Reader, dir), "not a pytorch_model.bin")
			c, err := openState(dir)
			require.NoError(t, err)
			defer c.Close()
			assert.Equal(t, ckpt.FormatTorchStateDict, c.Format)
			want := sttest.FileTensors(t, treetest.Testdata(tc.name, "expected.safetensors"))
			got := map[string][]byte{}
			optimizer := 0
			for _, tn := range c.Tensors {
				name, ok := strings.CutPrefix(tn.Name, tc.prefix)
				if tc.prefix != "" && !ok {
					require.True(t, strings.HasPrefix(tn.Name, "optimizer_state_dict.") || tn.Name == "loss", tn.Name)
					optimizer++
					continue
				}
				if tc.prefix == "" {
					assert.Nil(t, tn.Path, "a flat file records no nesting")
				} else {
					assert.Equal(t, []string{"model_state_dict", name}, tn.Path)
				}
				got[name] = readTensor(t, tn)
			}
			assert.Equal(t, tc.optimizer+btoi(tc.optimizer > 0), optimizer, "optimizer state and the loss")
			require.Len(t, got, len(want))
			for name, w := range want {
				assert.True(t, bytes.Equal(w, got[name]), "tensor %s differs", name)
			}
			var skipped []string
			for _, s := range c.Skipped {
				skipped = append(skipped, s.Name)
			}
			assert.Equal(t, tc.skipped, skipped)
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// nest pickles {k: v, ...} as a value inside another pickle (no PROTO, no
// STOP).
func nest(kv ...string) string {
	return "}(" + strings.Join(kv, "") + "u"
}

// TestStateDictHostile: a file that is not a state dict is not taken (so
// the directory is noted as unrecognised, not shown wrong), and a state
// dict that contradicts itself is an error naming the file and the cause.
func TestStateDictHostile(t *testing.T) {
	bad := pstr("w") + tensor{"FloatStorage", "5", 4, 0, []int64{2}, []int64{1}}.pkl()
	notTaken := []struct {
		name  string
		files map[string][]byte
	}{
		{"not a zip", map[string][]byte{"model.pt": []byte(strings.Repeat("x", 64))}},
		{"a list", map[string][]byte{"model.pt": model(t, []byte("\x80\x02]q\x00."))}},
		{"no tensors", map[string][]byte{"model.pt": model(t, dict(pstr("epoch")+pint(3)))}},
		{"optimizer state only", map[string][]byte{"optimizer.pt": model(t, dict(pstr("state")+nest(pint(0)+nest(w0()))))}},
		{"Megatron-LM's model_optim_rng.pt", map[string][]byte{"model_optim_rng.pt": model(t, dict(pstr("model")+nest(w0()), pstr("checkpoint_version")+pint(3)))}},
		{"DeepSpeed's model states", map[string][]byte{"mp_rank_00_model_states.pt": model(t, dict(pstr("module")+nest(w0()), pstr("ds_version")+pstr("0.19.8")))}},
		{"os.system beside the model's tensors", map[string][]byte{"model.pt": model(t, dict(pstr("model")+nest(w0(), pstr("x")+"cos\nsystem\n"+pstr("ls")+"\x85R")))}},
		{"another extension", map[string][]byte{"model.npz": model(t, dict(w0()))}},
		{"two state dicts", map[string][]byte{"a.pt": model(t, dict(w0())), "b.ckpt": model(t, dict(w0()))}},
	}
	for _, tc := range notTaken {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, b := range tc.files {
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
			}
			require.False(t, treetest.Detect(t, StateDictReader, dir))
			c, err := openState(dir)
			if err == nil {
				c.Close()
			}
			require.Error(t, err)
			assert.NotContains(t, err.Error(), "\n")
			if tc.name == "two state dicts" {
				assert.ErrorContains(t, err, "2 torch.save state dicts (a.pt, b.ckpt): a view shows one")
			}
		})
	}
	_, err := os.Stat("/tmp/pwned")
	assert.True(t, os.IsNotExist(err))

	many := map[string][]byte{}
	for i := range maxCandidates + 1 {
		many[fmt.Sprintf("f%02d.pt", i)] = []byte(strings.Repeat("x", 64))
	}
	for _, tc := range []struct {
		name  string
		files map[string][]byte
		err   string
	}{
		{"a broken tensor in the model", map[string][]byte{"model.pt": model(t, dict(pstr("state_dict")+nest(bad)))},
			`model.pt: data.pkl["state_dict"]["w"]: torch.save archive has no pytorch_model/data/5`},
		{"two tensors under one name", map[string][]byte{"model.pt": model(t, dict(pstr("model")+nest(w0()), pstr("model.w")+tensor{"FloatStorage", "1", 6, 0, []int64{6}, []int64{1}}.pkl()))},
			`model.pt: two tensors are named "model.w"`},
		{"a storage past its entry, nested", map[string][]byte{"x.ckpt": model(t, dict(pstr("module")+nest(pstr("w")+tensor{"FloatStorage", "0", 4, 3, []int64{2}, []int64{1}}.pkl())))},
			"x.ckpt: data.pkl[\"module\"][\"w\"]: bytes [12, 20) outside its storage"},
		{"too many candidates", many, fmt.Sprintf("more than %d torch.save candidates", maxCandidates)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, b := range tc.files {
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
			}
			c, err := openState(dir)
			if err == nil {
				c.Close()
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.err)
			assert.NotContains(t, err.Error(), "\n")
			assert.True(t, errors.Is(err, ckpt.ErrInvalid), err)
		})
	}
}

// FuzzOpenStateDict opens an arbitrary model.pt as a state dict under any
// name and reads every tensor it shows: errors, never a panic, a hang or
// an allocation beyond the bounds.
func FuzzOpenStateDict(f *testing.F) {
	for _, name := range []string{"torchsave_statedict_nested/ckpt/checkpoint.pth", "torchsave_statedict_flat/ckpt/model.pt"} {
		if b, err := os.ReadFile(treetest.Testdata(name)); err == nil {
			f.Add(b)
		}
	}
	f.Add(model(f, dict(pstr("model")+nest(w0()), pstr("optimizer")+nest(pstr("state")+nest(pint(0)+nest(w0()))))))
	f.Fuzz(func(t *testing.T, b []byte) {
		treetest.OpenWritten(t, map[string][]byte{"model.pt": b}, OpenStateDict)
	})
}
