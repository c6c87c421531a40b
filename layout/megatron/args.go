package megatron

import (
	"archive/zip"
	"fmt"
	"io"
	"strings"

	"github.com/ckptfs/ckptfs/layout/pickle"
	"github.com/ckptfs/ckptfs/layout/source"
)

// Bounds on common.pt, which holds the trainer's arguments and small
// state (a few KB in practice).
const (
	maxCommonBytes  = 64 << 20
	maxDataPklBytes = 16 << 20
)

// ReadArgs returns the training arguments a Megatron-LM checkpoint stores
// in common.pt (its "args" argparse.Namespace): the scalar ones (int64,
// float64, bool, string, nil) by name. A checkpoint without common.pt has
// none (nil, nil). Nothing is executed: the pickle is decoded by the
// restricted VM and tensors in it are never read.
func ReadArgs(dir source.Tree) (map[string]any, error) {
	if !source.Exists(dir, CommonFile) {
		return nil, nil
	}
	f, err := dir.Open(CommonFile)
	if err != nil {
		return nil, fmt.Errorf("megatron: %w", err)
	}
	defer f.Close()
	where := dir.Path(CommonFile)
	if f.Info().Size > maxCommonBytes {
		return nil, fmt.Errorf("megatron: %s is larger than %d bytes", where, maxCommonBytes)
	}
	zr, err := zip.NewReader(f, f.Info().Size)
	if err != nil {
		return nil, fmt.Errorf("megatron: %s: %w", where, err)
	}
	var pkl *zip.File
	for _, e := range zr.File {
		if strings.HasSuffix(e.Name, "/data.pkl") || e.Name == "data.pkl" {
			pkl = e
			break
		}
	}
	if pkl == nil {
		return nil, fmt.Errorf("megatron: %s: no data.pkl (not a torch.save archive)", where)
	}
	rc, err := pkl.Open()
	if err != nil {
		return nil, fmt.Errorf("megatron: %s: %w", where, err)
	}
	defer rc.Close()
	v, err := pickle.Decode(io.LimitReader(rc, maxDataPklBytes+1), pickle.Options{
		MaxInputBytes: maxDataPklBytes, MaxDepth: 64,
		PersistentLoad: func(any) (any, error) { return nil, nil }, // tensors: not needed
	})
	if err != nil {
		return nil, fmt.Errorf("megatron: %s: %w", where, err)
	}
	root, ok := v.(*pickle.Dict)
	if !ok {
		return nil, fmt.Errorf("megatron: %s holds a %s, not a dict", where, pickle.TypeName(v))
	}
	a, ok := root.Get("args")
	if !ok {
		return nil, nil
	}
	ns, ok := a.(*pickle.Object)
	if !ok || !ns.Is("argparse", "Namespace") || ns.StateDict() == nil {
		return nil, fmt.Errorf("megatron: %s: args is a %s, not an argparse.Namespace", where, pickle.TypeName(a))
	}
	args := map[string]any{}
	for _, it := range ns.StateDict().Items() {
		name, ok := it.Key.(string)
		if !ok {
			continue
		}
		switch val := it.Value.(type) {
		case nil, bool, int64, float64, string:
			args[name] = val
		}
	}
	return args, nil
}
