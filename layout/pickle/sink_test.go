package pickle

import (
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nopSink takes nothing: with it the VM only prunes the memo.
type nopSink struct{ built, set int }

func (s *nopSink) Built(*Object) (any, bool, error)      { s.built++; return nil, false, nil }
func (s *nopSink) SetItem(*Dict, any, any) (bool, error) { s.set++; return false, nil }

// takeSink takes every object of class name, leaving its name in its place,
// and every dict item whose value is one.
type takeSink struct {
	class string
	taken []*Object
	items int
}

type taken string

func (s *takeSink) Built(o *Object) (any, bool, error) {
	if o.Class.Name != s.class {
		return nil, false, nil
	}
	s.taken = append(s.taken, o)
	return taken(o.Class.Name), true, nil
}

func (s *takeSink) SetItem(_ *Dict, _, v any) (bool, error) {
	if _, ok := v.(taken); ok {
		s.items++
		return true, nil
	}
	return false, nil
}

// sinkSeeds are the pickles of testdata and the hostile table.
func sinkSeeds(t testing.TB) [][]byte {
	var out [][]byte
	files, _ := filepath.Glob("testdata/*.pkl")
	for _, p := range files {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		out = append(out, b)
	}
	for _, tc := range hostile {
		out = append(out, []byte(tc.in))
	}
	return out
}

// checkPruned decodes data with and without a sink that takes nothing:
// pruning the memo changes nothing but memory.
func checkPruned(t *testing.T, data []byte, opts Options) {
	want, werr := DecodeBytes(data, opts)
	opts.Sink = &nopSink{}
	got, err := DecodeBytes(data, opts)
	if werr != nil {
		require.Error(t, err)
		assert.Equal(t, werr.Error(), err.Error())
		return
	}
	require.NoError(t, err)
	assert.Equal(t, Repr(want), Repr(got))
}

func TestSinkPrunesNothingVisible(t *testing.T) {
	for i, b := range sinkSeeds(t) {
		t.Run(hex.EncodeToString(b[:min(len(b), 8)]), func(t *testing.T) {
			_ = i
			checkPruned(t, b, Options{PersistentLoad: func(pid any) (any, error) { return pid, nil }})
		})
	}
}

func TestScanRefs(t *testing.T) {
	// pickle.dumps(["a", "a", "b"], 4): "a" is put at 1 and got again;
	// the list (0) and "b" (2) are never got.
	b, err := hex.DecodeString("8004950f000000000000005d94288c01619468018c016294652e")
	require.NoError(t, err)
	r := scanRefs(b, Options{}.withDefaults())
	require.NotNil(t, r)
	assert.True(t, r.has(1))
	assert.False(t, r.has(0))
	assert.False(t, r.has(2))
	// A BINPUT out of order: nothing can be pruned.
	assert.Nil(t, scanRefs([]byte("\x80\x02N q\x05h\x05."), Options{}.withDefaults()))
	// Truncated: the VM reports it.
	assert.Nil(t, scanRefs([]byte("\x80\x02\x8c\x05ab"), Options{}.withDefaults()))
	assert.Nil(t, scanRefs([]byte("\x80\x02N\x94j\x00\x00\x00"), Options{}.withDefaults()))
	// LONG_BINGET: of entry 1, put; of entry 2^24+1, never put.
	r = scanRefs([]byte("\x80\x02N\x94N\x94j\x01\x00\x00\x00j\x01\x00\x00\x01."), Options{}.withDefaults())
	require.NotNil(t, r)
	assert.True(t, r.has(1))
	assert.False(t, r.has(0))
	assert.Len(t, r.kept, 1)
}

// A sink takes objects as they are built and items as they are set; what
// it takes leaves only the value it returned.
func TestSinkTakes(t *testing.T) {
	// d = {"a": C(), "b": [C(), 1]} with C a class whose state is {"x": 1}
	// (pickle.dumps(d, 4), by hand below with GLOBAL).
	p := "\x80\x04}\x94(\x8c\x01a\x94cm\nC\n)\x81}\x94\x8c\x01xK\x01sb\x8c\x01b]\x94(cm\nC\n)\x81}\x94\x8c\x01xK\x01sbK\x01eu."
	s := &takeSink{class: "C"}
	v, err := DecodeBytes([]byte(p), Options{Sink: s})
	require.NoError(t, err)
	assert.Len(t, s.taken, 2)
	assert.Equal(t, 1, s.items, "the dict item whose value was taken")
	assert.Equal(t, `{"b": [<pickle.taken>, 1]}`, Repr(v))
	// An error from the sink stops decoding at the opcode.
	_, err = DecodeBytes([]byte(p), Options{Sink: errSink{}})
	var pe *Error
	require.True(t, errors.As(err, &pe), "%v", err)
	assert.ErrorIs(t, err, errNo)
	assert.Equal(t, "BUILD", pe.Op)
}

var errNo = errors.New("no")

type errSink struct{}

func (errSink) Built(*Object) (any, bool, error)      { return nil, false, errNo }
func (errSink) SetItem(*Dict, any, any) (bool, error) { return false, nil }

// FuzzDecodeSink: pruning the memo never changes a decoding.
func FuzzDecodeSink(f *testing.F) {
	for _, b := range sinkSeeds(f) {
		f.Add(b)
	}
	opts := Options{MaxInputBytes: 1 << 20, MaxStringLen: 1 << 16, MaxItems: 1 << 16,
		MaxDepth: 64, MaxStack: 1 << 12, MaxMemo: 1 << 12,
		PersistentLoad: func(pid any) (any, error) { return pid, nil }}
	f.Fuzz(func(t *testing.T, data []byte) { checkPruned(t, data, opts) })
}
