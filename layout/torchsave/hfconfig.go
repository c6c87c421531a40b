package torchsave

// Composer's HuggingFaceModel saves the model's HF config inside its
// checkpoint: state["integrations"]["huggingface"]["model"]["config"] is
// {"file_extension": ".json", "content": config.to_dict()}. That dict,
// written back as JSON, is the view's config.json when none lies beside
// the checkpoint (ckpt.Checkpoint.HFConfig), so a Composer checkpoint,
// monolithic .pt or sharded DCP, loads as it is.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/torchzip"
	"github.com/ckptfs/ckptfs/layout/pickle"
)

// composerConfigPath is where Composer keeps the HF config, from the top of
// data.pkl.
var composerConfigPath = []string{"state", "integrations", "huggingface", "model", "config"}

// Bounds on the config written back: it is a few KiB in practice.
const (
	maxConfigJSON  = 1 << 20
	maxConfigDepth = 32
)

// embeddedConfig returns the HF config.json v holds at composerConfigPath,
// nil when it holds none there, and an error when what is there is no JSON
// config (a class of its own, a float JSON cannot write).
func embeddedConfig(v any) ([]byte, error) {
	at := v
	for _, k := range composerConfigPath {
		items, ok := DictItems(at)
		if !ok {
			return nil, nil
		}
		if at = dictGet(items, k); at == nil {
			return nil, nil
		}
	}
	items, ok := DictItems(at)
	if !ok {
		return nil, fmt.Errorf("data.pkl%s is %s, not a dict", pyPath(composerConfigPath), describe(at))
	}
	if ext, _ := dictGet(items, "file_extension").(string); ext != ".json" {
		return nil, fmt.Errorf("data.pkl%s holds a %q file, not a .json config", pyPath(composerConfigPath), ext)
	}
	content := dictGet(items, "content")
	if _, ok := DictItems(content); !ok {
		return nil, fmt.Errorf("data.pkl%s[\"content\"] is %s, not a dict", pyPath(composerConfigPath), describe(content))
	}
	var b bytes.Buffer
	if err := writeJSON(&b, content, 0); err != nil {
		return nil, fmt.Errorf("data.pkl%s[\"content\"]: %w", pyPath(composerConfigPath), err)
	}
	b.WriteByte('\n')
	return b.Bytes(), nil
}

var errConfigTooLarge = errors.New("larger than 1 MiB as JSON")

// writeJSON writes v, a decoded JSON-like Python value (dict with str
// keys, list, tuple, str, int, float, bool, None), as JSON; anything else
// is an error.
func writeJSON(b *bytes.Buffer, v any, depth int) error {
	if depth > maxConfigDepth {
		return fmt.Errorf("nested deeper than %d", maxConfigDepth)
	}
	if b.Len() > maxConfigJSON {
		return errConfigTooLarge
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case *big.Int:
		b.WriteString(x.String())
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("%v has no JSON form", x)
		}
		s := strconv.FormatFloat(x, 'g', -1, 64)
		if x == math.Trunc(x) && math.Abs(x) < 1e16 {
			s = strconv.FormatFloat(x, 'f', 1, 64) // 10000.0 stays a float for Python
		}
		b.WriteString(s)
	case string:
		b.WriteString(jsonString(x))
	default:
		if items, ok := DictItems(v); ok {
			b.WriteByte('{')
			for i, it := range items {
				k, ok := it.Key.(string)
				if !ok {
					return fmt.Errorf("a %s key, not a str", pickle.TypeName(it.Key))
				}
				if i > 0 {
					b.WriteString(", ")
				}
				q := jsonString(k)
				b.WriteString(q)
				b.WriteString(": ")
				if err := writeJSON(b, it.Value, depth+1); err != nil {
					return fmt.Errorf("%s: %w", q, err)
				}
			}
			b.WriteByte('}')
			return nil
		}
		if seq, ok := pickle.Seq(v); ok {
			b.WriteByte('[')
			for i, x := range seq {
				if i > 0 {
					b.WriteString(", ")
				}
				if err := writeJSON(b, x, depth+1); err != nil {
					return err
				}
			}
			b.WriteByte(']')
			return nil
		}
		return fmt.Errorf("%s has no JSON form", describe(v))
	}
	return nil
}

// jsonString quotes s as JSON does (a str always encodes).
func jsonString(s string) string {
	q, _ := json.Marshal(s)
	return string(q)
}

// Bounds on the items ObjectsConfig decodes: a config's leaves are a few
// dozen small values.
const (
	maxConfigItems  = 4096
	maxConfigObject = 64 << 10
)

// ObjectsConfig returns the HF config.json Composer saved inside a torch
// DCP checkpoint, nil when objs hold none: DCP flattens
// state["integrations"]["huggingface"]["model"]["config"] into one item per
// leaf, each a torch.save archive of the value, whose saved nesting
// (Object.Path) puts the dict back together.
func ObjectsConfig(objs []ckpt.Object) ([]byte, error) {
	root := &pickle.Dict{}
	n := 0
	for _, o := range objs {
		if len(o.Path) <= len(composerConfigPath) || !slices.Equal(o.Path[:len(composerConfigPath)], composerConfigPath) {
			continue
		}
		if n++; n > maxConfigItems {
			return nil, fmt.Errorf("more than %d items under %s", maxConfigItems, strings.Join(composerConfigPath, "."))
		}
		v, err := objectValue(o)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", o.Name, o.Source, err)
		}
		if err := setPath(root, o.Path, v); err != nil {
			return nil, fmt.Errorf("%s: %w", o.Name, err)
		}
	}
	if n == 0 {
		return nil, nil
	}
	return embeddedConfig(root)
}

// objectValue decodes a DCP item: a small torch.save archive of one value.
func objectValue(o ckpt.Object) (any, error) {
	if o.Bytes == nil {
		return nil, errors.New("stored compressed, not a plain item")
	}
	if o.Size > maxConfigObject {
		return nil, fmt.Errorf("%d bytes, more than the %d a config value takes", o.Size, maxConfigObject)
	}
	z, err := torchzip.Open(o.Bytes, o.Size)
	if err != nil {
		return nil, err
	}
	return z.Decode(torchzip.Record)
}

// setPath sets the value at path in d, making the dicts on the way.
func setPath(d *pickle.Dict, path []string, v any) error {
	for i, k := range path[:len(path)-1] {
		next, ok := d.Get(k)
		if !ok {
			next = &pickle.Dict{}
			if err := d.Set(k, next); err != nil {
				return err
			}
		}
		if d, ok = next.(*pickle.Dict); !ok {
			return fmt.Errorf("%s is a value and a dict", strings.Join(path[:i+1], "."))
		}
	}
	last := path[len(path)-1]
	if _, dup := d.Get(last); dup {
		return fmt.Errorf("%s is saved twice", strings.Join(path, "."))
	}
	return d.Set(last, v)
}
