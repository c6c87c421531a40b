package view

import "github.com/ckptfs/ckptfs/safetensors"

// content is the bytes of one view tensor: a checkpoint tensor as stored
// (geometry), or one assembled by a mapping from pieces of checkpoint
// tensors (mapped). Either way every byte is gathered from shard ranges on
// demand.
type content interface {
	dtype() safetensors.DType
	shape() []int64
	size() int64
	// plan adds to p the reads that fill dst with the tensor's bytes from
	// byte pos on.
	plan(p *readPlan, dst []byte, pos int64) error
	// backing adds to s what the bytes come from.
	backing(s *sourceSet)
	origin() Origin
	// resident bounds what it holds, reads included (resident.go), each
	// geometry counted once in seen.
	resident(seen map[*geometry]bool) int64
}

// Origin says where a view tensor comes from, for inspect.
type Origin struct {
	// Sources are the checkpoint tensors it is made of.
	Sources []string `json:"sources"`
	// Transform describes what was done to them; "" for a tensor as stored.
	Transform string `json:"transform,omitempty"`
}

// viewTensor is a tensor under the name it has in the view.
type viewTensor struct {
	name    string
	content content
}

// stored views each selected tensor as it is stored.
func stored(ts []named) ([]viewTensor, error) {
	out := make([]viewTensor, len(ts))
	for i, t := range ts {
		g, err := newGeometry(t.tensor)
		if err != nil {
			return nil, err
		}
		out[i] = viewTensor{t.name, g}
	}
	return out, nil
}

func (g *geometry) dtype() safetensors.DType { return g.tensor.DType }
func (g *geometry) shape() []int64           { return g.tensor.Shape }
func (g *geometry) size() int64              { return g.bytes }
func (g *geometry) origin() Origin           { return Origin{Sources: []string{g.tensor.Name}} }

func (g *geometry) backing(s *sourceSet) { s.whole(g) }
