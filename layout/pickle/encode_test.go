package pickle

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEncodeInts checks integer opcodes against CPython's
// pickle.dumps(v, 2) (values printed by python3), and that Decode reads
// them back.
func TestEncodeInts(t *testing.T) {
	for _, tc := range []struct {
		v    int64
		want string
	}{
		{0, "4b00"}, {255, "4bff"}, {256, "4d0001"}, {65535, "4dffff"},
		{65536, "4a00000100"}, {2147483647, "4affffff7f"}, {2147483648, "8a050000008000"},
		{-1, "4affffffff"}, {-2147483648, "4a00000080"}, {-2147483649, "8a05ffffff7fff"},
		{1 << 40, "8a06000000000001"}, {1<<55 - 1, "8a07ffffffffffff7f"}, {1 << 55, "8a080000000000008000"},
		{9223372036854775807, "8a08ffffffffffffff7f"}, {-9223372036854775808, "8a080000000000000080"},
		{-1 << 40, "8a060000000000ff"},
	} {
		e := NewEncoder()
		e.Int(tc.v)
		b := e.Bytes()
		assert.Equal(t, tc.want, hex.EncodeToString(b[2:len(b)-1]), "%d", tc.v)
		v, err := DecodeBytes(b, Options{})
		require.NoError(t, err)
		assert.Equal(t, tc.v, v)
	}
	e := NewEncoder()
	e.IntTuple([]int64{1, 2, 3, 4})
	assert.Equal(t, "8002284b014b024b034b04742e", hex.EncodeToString(e.Bytes()))
	e = NewEncoder()
	e.Str("ab")
	assert.Equal(t, "8002580200000061622e", hex.EncodeToString(e.Bytes()))
	// A container whose items push nothing is its empty opcode alone; one
	// that has items adds them in one MARK … APPENDS/SETITEMS batch.
	e = NewEncoder()
	e.Dict(func() {})
	assert.Equal(t, "80027d2e", hex.EncodeToString(e.Bytes()))
	e = NewEncoder()
	e.List(func() { e.Int(1) })
	assert.Equal(t, "80025d284b01652e", hex.EncodeToString(e.Bytes()))
}

// TestEncodeRoundTrip encodes every shape the Encoder writes and decodes it.
func TestEncodeRoundTrip(t *testing.T) {
	e := NewEncoder()
	e.Object("m", "C", func() {
		e.Dict(func() {
			e.Str("none")
			e.None()
			e.Str("bools")
			e.Tuple(2, func() { e.Bool(true); e.Bool(false) })
			e.Str("list")
			e.List(func() {
				for i := range 5 {
					e.Int(int64(i) << 40)
				}
			})
			e.Str("empty")
			e.List(nil)
			e.Str("call")
			e.Call("torch", "Size", 1, func() { e.IntTuple([]int64{2, 3}) })
			e.Str("pid")
			e.PersistentID(2, func() { e.Str("storage"); e.Global("torch", "FloatStorage") })
		})
	})
	var pid any
	v, err := DecodeBytes(e.Bytes(), Options{PersistentLoad: func(p any) (any, error) { pid = p; return "S", nil }})
	require.NoError(t, err)
	obj, ok := v.(*Object)
	require.True(t, ok)
	assert.True(t, obj.Is("m", "C"))
	st := obj.StateDict()
	require.NotNil(t, st)
	get := func(k string) any {
		v, ok := st.Get(k)
		require.True(t, ok, k)
		return v
	}
	assert.Nil(t, get("none"))
	assert.Equal(t, Tuple{true, false}, get("bools"))
	assert.Equal(t, []any{int64(0), int64(1 << 40), int64(2 << 40), int64(3 << 40), int64(4 << 40)}, get("list").(*List).Items)
	assert.Empty(t, get("empty").(*List).Items)
	size := get("call").(*Object)
	assert.True(t, size.Is("torch", "Size"))
	assert.Equal(t, []any{Tuple{int64(2), int64(3)}}, []any(size.Args))
	assert.Equal(t, "S", get("pid"))
	assert.Equal(t, Tuple{"storage", Global{Module: "torch", Name: "FloatStorage"}}, pid)
}

// A name holding a newline cannot be a GLOBAL line: it is written so that
// it reads back whole, and so does CPython (pickle.loads of the bytes below
// with find_class overridden returns ("a\nb", "c\nd")).
func TestEncodeGlobalWithNewline(t *testing.T) {
	e := NewEncoder()
	e.Global("a\nb", "c\nd")
	b := e.Bytes()
	assert.Equal(t, "80025803000000610a625803000000630a64932e", hex.EncodeToString(b))
	v, err := DecodeBytes(b, Options{})
	require.NoError(t, err)
	assert.Equal(t, Global{Module: "a\nb", Name: "c\nd"}, v)
}

// A memo encoder writes what CPython's pickle.dumps(v, 4) writes (printed
// by python3, its FRAME left out) for
// {'a': (1, 2), 'b': ['a', 'a', ()], 'c': collections.OrderedDict}, and
// gets a global written before.
func TestMemoEncoder(t *testing.T) {
	e := NewMemoEncoder()
	e.Dict(func() {
		e.Str("a")
		e.IntTuple([]int64{1, 2})
		e.Str("b")
		e.List(func() {
			e.Str("a")
			e.Str("a")
			e.Tuple(0, nil)
		})
		e.Str("c")
		e.Global("collections", "OrderedDict")
	})
	b := e.Bytes()
	assert.Equal(t, "80047d94288c0161944b014b0286948c0162945d94286801680129658c0163948c0b636f6c6c656374696f6e73948c0b4f72646572656444696374949394752e",
		hex.EncodeToString(b))
	v, err := DecodeBytes(b, Options{})
	require.NoError(t, err)
	assert.Equal(t, `{"a": (1, 2), "b": ["a", "a", ()], "c": collections.OrderedDict}`, Repr(v))

	e = NewMemoEncoder()
	e.Tuple(2, func() {
		e.Call("torch", "Size", 1, func() { e.IntTuple([]int64{3}) })
		e.Global("torch", "Size")
	})
	// torch, Size, the global, (3,), ((3,),), the call, then a get of 2:
	// pickle.dumps((torch.Size((3,)), torch.Size), 4), its FRAME left out.
	assert.Equal(t, "80048c05746f726368948c0453697a65949394"+"4b038594"+"8594"+"5294"+"6802"+"8694"+"2e", hex.EncodeToString(e.Bytes()))
}

// A memo encoder's DictOf adds items in batches of 1000 as CPython does:
// pickle.dumps({i: i for i in range(1001)}, 4), its FRAME left out, has
// this sha256; a dict of one item is SETITEM, of none its EMPTY_DICT.
func TestMemoEncoderBatches(t *testing.T) {
	e := NewMemoEncoder()
	e.DictOf(1001, func(i int) { e.Int(int64(i)); e.Int(int64(i)) })
	b := e.Bytes()
	sum := sha256.Sum256(b)
	assert.Equal(t, "9eb456ea6aa55209cbecaa679ca2e454eb946c561c3e04ffec6cb32eb076d9e0", hex.EncodeToString(sum[:]), "%d bytes", len(b))
	v, err := DecodeBytes(b, Options{})
	require.NoError(t, err)
	assert.Len(t, v.(*Dict).Items(), 1001)

	e = NewMemoEncoder()
	e.DictOf(1, func(int) { e.Int(1); e.None() })
	e.DictOf(0, nil)
	assert.Equal(t, "80047d944b014e737d942e", hex.EncodeToString(e.Bytes()))
}

// NewStr writes a str equal to one written before in full, memoized and
// never got, as CPython does for a distinct str object: pickle.dumps([a, b,
// a], 4) with a = 'ab' and b = ”.join(['a', 'b']), its FRAME left out.
func TestMemoEncoderNewStr(t *testing.T) {
	e := NewMemoEncoder()
	e.List(func() {
		e.Str("ab")
		e.NewStr("ab")
		e.Str("ab")
	})
	assert.Equal(t, "80045d94288c026162948c026162946801652e", hex.EncodeToString(e.Bytes()))
	e = NewMemoEncoder()
	e.List(func() { e.NewStr(strings.Repeat("x", 300)); e.NewStr("y") })
	v, err := DecodeBytes(e.Bytes(), Options{})
	require.NoError(t, err)
	assert.Equal(t, `["`+strings.Repeat("x", 300)+`", "y"]`, Repr(v))
	// Without a memo, NewStr is Str.
	e, e2 := NewEncoder(), NewEncoder()
	e.NewStr("ab")
	e2.Str("ab")
	assert.Equal(t, e2.Bytes(), e.Bytes())
}
