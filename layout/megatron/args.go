package megatron

import (
	"fmt"
	"io"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/torchzip"
	"github.com/ckptfs/ckptfs/layout/pickle"
	"github.com/ckptfs/ckptfs/layout/source"
)

// CommonStateKey is the DCP key of the common state megatron-core 0.17 and
// later save inside the checkpoint instead of common.pt: the ShardedObject
// "common_state" of global shape (1,) at offset (0,) (serialization.py
// save), a BYTE_IO item holding torch.save([common]).
const CommonStateKey = "common_state/shard_0_1"

// maxCommonBytes bounds the common state (common.pt or common_state),
// which holds the trainer's arguments and small state (a few KB in
// practice); its data.pkl is decoded within torchzip.WholeFile.
const maxCommonBytes = 64 << 20

// readCommonFile reads the common state from common.pt; none (and no
// error) without it. Nothing is executed: the pickle is decoded by the
// restricted VM and tensors in it are never read.
func readCommonFile(dir source.Tree) (common, error) {
	if !source.Exists(dir, CommonFile) {
		return common{}, nil
	}
	f, err := dir.Open(CommonFile)
	if err != nil {
		return common{}, fmt.Errorf("megatron: %w", err)
	}
	defer f.Close()
	cs, err := decodeCommon(f, f.Info().Size, false)
	if err != nil {
		return common{}, fmt.Errorf("megatron: %s: %w", dir.Path(CommonFile), err)
	}
	return cs, nil
}

// readCommon returns the common state of an opened checkpoint: from
// common.pt when there is one (megatron-core ≤ 0.16; it is what mcore
// itself loads first), else from the common_state object.
func readCommon(dir source.Tree, c *ckpt.Checkpoint) (common, error) {
	if source.Exists(dir, CommonFile) {
		return readCommonFile(dir)
	}
	return commonStateOf(c)
}

func commonStateOf(c *ckpt.Checkpoint) (common, error) {
	for _, o := range c.Objects {
		if o.Name != CommonStateKey {
			continue
		}
		where := fmt.Sprintf("%s: %s (%s)", c.Dir, o.Name, o.Source)
		if o.Bytes == nil { // Megatron writes none compressed
			return common{}, fmt.Errorf("megatron: %s: stored compressed, not a plain item", where)
		}
		// torchdcp has bounds-checked the item against the file.
		cs, err := decodeCommon(o.Bytes, o.Size, true)
		if err != nil {
			return common{}, fmt.Errorf("megatron: %s: %w", where, err)
		}
		return cs, nil
	}
	return common{}, nil
}

// common is what ckptfs reads of the common state.
type common struct {
	// args are the scalar training arguments, by name.
	args Args
	// singleton says keys were saved per layer and per expert (the
	// content_metadata flag singleton_local_shards): see stackSingletons.
	singleton bool
}

// decodeCommon decodes a torch.save archive of the common state: the dict
// itself (common.pt), or, inList, a list of exactly that dict
// (common_state).
func decodeCommon(r io.ReaderAt, size int64, inList bool) (common, error) {
	args, root, err := decodeArgs(r, size, inList)
	if err != nil || root == nil {
		return common{args: args}, err
	}
	cs := common{args: args}
	if cm, ok := root.Get("content_metadata"); ok {
		if d, ok := cm.(*pickle.Dict); ok {
			if v, ok := d.Get("singleton_local_shards"); ok {
				cs.singleton, _ = v.(bool)
			}
		}
	}
	return cs, nil
}

// decodeArgs decodes the common state's dict and its args.
func decodeArgs(r io.ReaderAt, size int64, inList bool) (map[string]any, *pickle.Dict, error) {
	if size > maxCommonBytes {
		return nil, nil, fmt.Errorf("larger than %d bytes", maxCommonBytes)
	}
	z, err := torchzip.Open(r, size)
	if err != nil {
		return nil, nil, err
	}
	v, err := z.Decode(torchzip.WholeFile)
	if err != nil {
		return nil, nil, err
	}
	if inList {
		l, ok := v.(*pickle.List)
		if !ok || len(l.Items) != 1 {
			return nil, nil, fmt.Errorf("holds a %s, not a list of one common state", describe(v))
		}
		v = l.Items[0]
	}
	root, ok := v.(*pickle.Dict)
	if !ok {
		return nil, nil, fmt.Errorf("holds a %s, not a dict", pickle.TypeName(v))
	}
	a, ok := root.Get("args")
	if !ok {
		return nil, root, nil
	}
	args, err := NamespaceArgs(a)
	return args, root, err
}

// NamespaceArgs returns the scalar attributes (int64, float64, bool,
// string, nil) of a decoded argparse.Namespace by name: Megatron-LM's args
// wherever a checkpoint pickles them.
func NamespaceArgs(a any) (map[string]any, error) {
	ns, ok := a.(*pickle.Object)
	if !ok || !ns.Is("argparse", "Namespace") || ns.StateDict() == nil {
		return nil, fmt.Errorf("args is a %s, not an argparse.Namespace", pickle.TypeName(a))
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

// describe names a decoded value's type, with a list's length.
func describe(v any) string {
	if l, ok := v.(*pickle.List); ok {
		return fmt.Sprintf("list of %d", len(l.Items))
	}
	return pickle.TypeName(v)
}
