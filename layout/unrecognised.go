package layout

import (
	"fmt"
	"sort"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchsave"
)

// expects says, per format, what Detect looks for: the readers tried, as a
// message names them.
var expects = map[ckpt.Format]string{
	ckpt.FormatMegatron:           "a DCP .metadata beside a Megatron metadata.json",
	ckpt.FormatTorchDCP:           "a DCP .metadata",
	ckpt.FormatHFSharded:          "shard-*-model-*.safetensors",
	ckpt.FormatPlainHF:            "model.safetensors[.index.json]",
	ckpt.FormatTorchSave:          "pytorch_model.bin[.index.json]",
	ckpt.FormatMegatronLegacy:     "mp_rank_*/model_optim_rng.pt",
	ckpt.FormatDeepSpeed:          "DeepSpeed *_model_states.pt with *_optim_states.pt",
	ckpt.FormatStages:             "pp0/ pipeline stages",
	ckpt.FormatDeepSpeedUniversal: "mp_rank_00_model_states.pt beside zero/<param>/fp32.pt",
	ckpt.FormatMetaLlama:          "params.json with consolidated.00.pth",
	ckpt.FormatTrainerDeepSpeed:   "a `latest` file naming a DeepSpeed checkpoint directory",
	ckpt.FormatTrainerFSDP:        "pytorch_model_fsdp_0/, a DCP of the model",
	ckpt.FormatTorchStateDict:     "one torch.save dict of tensors, flat or under state_dict/model/module/model_state_dict/state.model, named *.pt/*.pth/*.ckpt/*.bin",
}

// triedReaders names each format Detect tries, in order, with what it
// looks for.
func triedReaders() string {
	var parts []string
	for _, f := range Formats {
		s := string(f.Format())
		if e := expects[f.Format()]; e != "" {
			s += " (" + e + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// tensorExts are the endings of files that hold tensors in some format.
var tensorExts = []string{".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".distcp"}

// maxNamed bounds the file names an Unrecognised line lists.
const maxNamed = 8

// Unrecognised returns, for the directory dir holding the entries ents
// that no format's Detect took, one line naming the tensor files it holds
// and the readers tried (and why the torch.save reader took none, when it
// found several); "" when it holds no tensor file (a training root, a
// tokenizer folder): then there is nothing to say.
func Unrecognised(dir source.Tree, ents []source.Info) string {
	var names []string
	for _, e := range ents {
		if !e.IsRegular() {
			continue
		}
		for _, ext := range tensorExts {
			if strings.HasSuffix(e.Name, ext) {
				names = append(names, e.Name)
				break
			}
		}
	}
	if len(names) == 0 {
		return ""
	}
	sort.Strings(names)
	shown := names
	if len(shown) > maxNamed {
		shown = shown[:maxNamed]
	}
	list := strings.Join(shown, ", ")
	if len(names) > len(shown) {
		list += fmt.Sprintf(", ... (%d files)", len(names))
	}
	why := ""
	if _, err := torchsave.StateDictFile(dir); err != nil {
		why = " (" + err.Error() + ")"
	}
	return fmt.Sprintf("%s: no checkpoint reader takes the tensor files here (%s)%s; files shown as they are. Readers tried: %s",
		dir.Path("."), list, why, triedReaders())
}

// notFound is the error of opening a directory no format takes: the
// Unrecognised line when it holds tensor files.
func notFound(dir source.Tree) error {
	if ents, err := dir.ReadDir("."); err == nil {
		if msg := Unrecognised(dir, ents); msg != "" {
			return fmt.Errorf("layout: %s", msg)
		}
	}
	return fmt.Errorf("layout: %s: no checkpoint found (readers tried: %s)", dir.Path("."), triedReaders())
}
