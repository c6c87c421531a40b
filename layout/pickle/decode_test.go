package pickle

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

func TestDecodeValues(t *testing.T) {
	for _, proto := range []string{"2", "3", "4", "5"} {
		t.Run("protocol"+proto, func(t *testing.T) {
			v, err := DecodeBytes(readTestdata(t, "values_p"+proto+".pkl"), Options{})
			require.NoError(t, err)
			d, ok := v.(*Dict)
			require.True(t, ok, "root is %s", TypeName(v))

			var keys []string
			for _, it := range d.Items() {
				keys = append(keys, Repr(it.Key))
			}
			assert.Equal(t, []string{`"a"`, `"b"`, `"t"`, `"big"`, `"neg"`, `"i32"`, `"u16"`, `"s"`, `"fs"`,
				`5`, `(1, "k")`, `"ba"`, `"long"`, `"od"`, `"shared"`, `"empty"`}, keys)

			get := func(k any) any {
				v, ok := d.Get(k)
				require.True(t, ok, "key %s", Repr(k))
				return v
			}
			assert.Equal(t, int64(1), get("a"))
			b := get("b").(*List)
			require.Len(t, b.Items, 7)
			assert.Equal(t, []any{int64(1), 2.5, "x"}, b.Items[:3])
			if proto == "2" { // bytes need protocol 3
				assert.Equal(t, `_codecs.encode("by", "latin1")`, Repr(b.Items[3]))
			} else {
				assert.Equal(t, []byte("by"), b.Items[3])
			}
			assert.Equal(t, []any{nil, true, false}, b.Items[4:])
			assert.Equal(t, Tuple{int64(1), Tuple{int64(2), int64(3)}}, get("t"))
			want := new(big.Int).Lsh(big.NewInt(1), 70)
			assert.Equal(t, 0, want.Cmp(get("big").(*big.Int)))
			assert.Equal(t, int64(-1<<40), get("neg"))
			assert.Equal(t, int64(-5), get("i32"))
			assert.Equal(t, int64(65535), get("u16"))
			assert.Equal(t, "intkey", get(int64(5)))
			assert.Equal(t, "tuplekey", get(Tuple{int64(1), "k"}))
			assert.Equal(t, strings.Repeat("x", 300), get("long"))
			assert.Equal(t, Tuple{}, get("empty"))

			od := get("od").(*Object)
			assert.True(t, od.Is("collections", "OrderedDict"))
			assert.Equal(t, `{"a": 1}`, Repr(od.Extras().Items))

			shared := get("shared").(*List)
			require.Len(t, shared.Items, 2)
			assert.Same(t, shared.Items[0].(*List), shared.Items[1].(*List), "memo sharing keeps identity")

			switch proto {
			case "2", "3":
				assert.Contains(t, Repr(get("s")), ".set([1])")
				assert.Contains(t, Repr(get("fs")), ".frozenset([3])")
			default:
				assert.Equal(t, "{1}", Repr(get("s")))
				assert.Equal(t, "frozenset{3}", Repr(get("fs")))
			}
		})
	}
}

func TestDecodeObjects(t *testing.T) {
	for name, want := range map[string]string{
		"objects_p4.pkl": `[__main__.Plain.__new__()<state {"x": 1, "name": "plain"}>, ` +
			`__main__.Slots.__new__()<state (None, {"a": 7})>, ` +
			`__main__.TupleState.__new__()<state (1, "two")>, ` +
			`__main__.Reduced("arg", 3), ` +
			`__main__.KwNew.__new__(1, **{"k": "v"}), ` +
			`__main__.MyList.__new__()<appended [4]>]`,
		"objects_p2.pkl": `[__main__.Plain.__new__()<state {"x": 1, "name": "plain"}>, ` +
			`__main__.Slots.__new__()<state (None, {"a": 7})>, ` +
			`__main__.TupleState.__new__()<state (1, "two")>, ` +
			`__main__.Reduced("arg", 3), ` +
			`functools.partial(__builtin__.getattr(__main__.KwNew, "__new__"))` +
			`<state (__builtin__.getattr(__main__.KwNew, "__new__"), (__main__.KwNew, 1), {"k": "v"}, None)>(), ` +
			`__main__.MyList.__new__()<appended [4]>]`,
	} {
		t.Run(name, func(t *testing.T) {
			v, err := DecodeBytes(readTestdata(t, name), Options{})
			require.NoError(t, err)
			assert.Equal(t, want, Repr(v))
			objs := v.(*List).Items
			plain := objs[0].(*Object)
			assert.True(t, plain.Is("__main__", "Plain"))
			assert.Equal(t, `{"x": 1, "name": "plain"}`, Repr(plain.StateDict()))
			assert.Equal(t, `{"a": 7}`, Repr(objs[1].(*Object).StateDict()))
		})
	}
}

func TestPersistentLoad(t *testing.T) {
	in := []byte("\x80\x02(X\x07\x00\x00\x00storagecfoo\nBar\nK\x05tQ.")
	var got any
	v, err := DecodeBytes(in, Options{PersistentLoad: func(pid any) (any, error) {
		got = pid
		return "loaded", nil
	}})
	require.NoError(t, err)
	assert.Equal(t, "loaded", v)
	assert.Equal(t, `("storage", foo.Bar, 5)`, Repr(got))

	_, err = DecodeBytes(in, Options{PersistentLoad: func(any) (any, error) { return nil, errors.New("nope") }})
	require.ErrorContains(t, err, "persistent load: nope")
}

func u32(v uint32) string { var b [4]byte; binary.LittleEndian.PutUint32(b[:], v); return string(b[:]) }
func u64(v uint64) string { var b [8]byte; binary.LittleEndian.PutUint64(b[:], v); return string(b[:]) }

// hostile lists inputs that must fail cleanly; the fuzz target is seeded from
// them.
var hostile = []struct {
	name  string
	in    string
	opts  Options
	err   string
	limit bool
}{
	{name: "empty", in: "", err: "no STOP"},
	{name: "unknown opcode", in: "\x80\x02\xff.", err: "unknown opcode 0xff at offset 2"},
	{name: "unsupported text opcode", in: "I1\n.", err: "unsupported opcode INT (0x49) at offset 0"},
	{name: "protocol 6", in: "\x80\x06N.", err: "unsupported protocol 6"},
	{name: "truncated string", in: "\x80\x04\x8c\x05ab", err: "truncated input"},
	{name: "string longer than input", in: "X" + u32(1000) + "ab.", err: "truncated input"},
	{name: "giant BINUNICODE8", in: "\x8d" + u64(1<<62) + ".", err: "exceeds the limit", limit: true},
	{name: "giant BINBYTES8", in: "\x8e" + u64(1<<40) + ".", err: "exceeds the limit", limit: true},
	{name: "giant LONG4", in: "\x8b" + u32(1<<30) + ".", err: "integer of 1073741824 bytes", limit: true},
	{name: "deep tuple nesting", in: "N" + strings.Repeat("\x85", 1000) + ".", err: "nested deeper than 256", limit: true},
	{name: "deep list nesting", in: strings.Repeat("]", 300) + strings.Repeat("a", 299) + ".", err: "nested deeper than 256", limit: true},
	{name: "memo bomb", in: "N" + strings.Repeat("r\x00\x00\x00\x00", 1) + func() string {
		var b strings.Builder
		for i := 0; i < 200; i++ {
			b.WriteString("r" + u32(uint32(i)*7919))
		}
		return b.String()
	}() + ".", opts: Options{MaxMemo: 100}, err: "more than 100 memo entries", limit: true},
	{name: "memo get missing", in: "j\x05\x00\x00\x00.", err: "memo key 5 not found"},
	{name: "stack bomb", in: strings.Repeat("N", 200) + ".", opts: Options{MaxStack: 100}, err: "stack deeper than 100", limit: true},
	{name: "mark bomb", in: strings.Repeat("(", 200) + ".", opts: Options{MaxStack: 100}, err: "stack deeper than 100", limit: true},
	{name: "tuple memo bomb", in: tupleBomb(5, 10), opts: Options{MaxItems: 10000}, err: "more than 10000 container items", limit: true},
	{name: "late-growing list bomb", in: lateListBomb(5, 10), opts: Options{MaxItems: 10000}, err: "more than 10000 container items", limit: true},
	{name: "items bomb", in: "]" + strings.Repeat("(NNNNNNNNNNe", 20) + ".", opts: Options{MaxItems: 100}, err: "more than 100 container items", limit: true},
	{name: "input too large", in: strings.Repeat("N", 20) + ".", opts: Options{MaxInputBytes: 10}, err: "input larger than 10 bytes", limit: true},
	{name: "long GLOBAL line", in: "c" + strings.Repeat("a", 100), opts: Options{MaxStringLen: 10}, err: "line longer than 10", limit: true},
	{name: "REDUCE on int", in: "K\x01)R.", err: "only globals and objects can be called"},
	{name: "REDUCE args not tuple", in: "cos\nsystem\nNR.", err: "arguments must be a tuple"},
	{name: "BUILD on list", in: "]}b.", err: "BUILD on list"},
	{name: "persistent id without hook", in: "X\x01\x00\x00\x00kQ.", err: "without a persistent-load hook"},
	{name: "unhashable key", in: "}]Ns.", err: "unhashable key type list"},
	{name: "append to tuple", in: ")Na.", err: "cannot append to tuple"},
	{name: "stack underflow", in: "a.", err: "stack underflow"},
	{name: "STOP on empty stack", in: ".", err: "stack underflow"},
	{name: "POP_MARK without MARK", in: "1.", err: "no MARK"},
	{name: "mark hides lower stack", in: "](Na.", err: "stack underflow"},
	{name: "odd SETITEMS", in: "}(Nu.", err: "odd number of items"},
	{name: "STACK_GLOBAL of ints", in: "K\x01K\x02\x93.", err: "STACK_GLOBAL needs two strings"},
}

func TestDecodeHostile(t *testing.T) {
	for _, tc := range hostile {
		t.Run(tc.name, func(t *testing.T) {
			v, err := DecodeBytes([]byte(tc.in), tc.opts)
			require.Error(t, err, "decoded %s", Repr(v))
			assert.ErrorContains(t, err, tc.err)
			assert.True(t, strings.HasPrefix(err.Error(), "pickle: "), err.Error())
			assert.Equal(t, tc.limit, errors.Is(err, ErrLimit), "ErrLimit for %v", err)
			var pe *Error
			assert.ErrorAs(t, err, &pe)
		})
	}
}

func TestDecodeInert(t *testing.T) {
	// Unknown globals, even dangerous ones, only become names.
	v, err := DecodeBytes([]byte("\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R."), Options{})
	require.NoError(t, err)
	o := v.(*Object)
	assert.True(t, o.Is("os", "system"))
	assert.Equal(t, Tuple{"ls"}, o.Args)

	// A list that contains itself decodes and prints.
	v, err = DecodeBytes([]byte("]\x94h\x00a."), Options{})
	require.NoError(t, err)
	assert.Equal(t, "[...]", Repr(v))

	// Huge memo indices need no huge memo.
	v, err = DecodeBytes([]byte("K\x07r\xff\xff\xff\xff0j\xff\xff\xff\xff."), Options{})
	require.NoError(t, err)
	assert.Equal(t, int64(7), v)

	// The input limit holds, and bytes after STOP are not read.
	_, err = DecodeBytes([]byte(strings.Repeat("N", 100)+"."), Options{MaxInputBytes: 50})
	require.ErrorIs(t, err, ErrLimit)
	v, err = DecodeBytes([]byte("\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00\x8a\x01\xff.trailing"), Options{})
	require.NoError(t, err)
	assert.Equal(t, int64(-1), v)
}

// TestMemoAcrossPages memoizes more entries than fit in a few memo pages,
// one of them first put out of order (sparse, then taken into the pages),
// and reads every one back.
func TestMemoAcrossPages(t *testing.T) {
	const n = 3*memoPage + 5
	var b bytes.Buffer
	put := func(i uint32) {
		b.WriteByte('r') // LONG_BINPUT
		binary.Write(&b, binary.LittleEndian, i)
	}
	get := func(i uint32) {
		b.WriteByte('j') // LONG_BINGET
		binary.Write(&b, binary.LittleEndian, i)
	}
	str := func(i int) string { return "s" + strconv.Itoa(i) }
	b.WriteString("\x80\x02]") // PROTO 2, EMPTY_LIST
	b.WriteByte('(')           // MARK
	for i := range n {
		sv := str(i)
		b.WriteByte('X') // BINUNICODE
		binary.Write(&b, binary.LittleEndian, uint32(len(sv)))
		b.WriteString(sv)
		if i == memoPage+1 {
			// An index ahead of the pages is kept aside; the put at its
			// turn replaces it.
			put(2 * memoPage)
		}
		put(uint32(i))
	}
	b.WriteString("e") // APPENDS
	b.WriteByte(']')
	b.WriteByte('(')
	for i := range n {
		get(uint32(i))
	}
	b.WriteString("e\x86.") // APPENDS, TUPLE2, STOP
	v, err := DecodeBytes(b.Bytes(), Options{})
	require.NoError(t, err)
	tup := v.(Tuple)
	put1, got := tup[0].(*List).Items, tup[1].(*List).Items
	require.Len(t, put1, n)
	require.Len(t, got, n)
	for i := range n {
		require.Equal(t, str(i), got[i], "memo entry %d", i)
	}
}

func TestDecodeLong(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want string
	}{
		{nil, "0"},
		{[]byte{0xff}, "-1"},
		{[]byte{0x00, 0x80}, "-32768"},
		{[]byte{0x00, 0x80, 0x00}, "32768"},
		{[]byte{0x00, 0x00, 0x00, 0x80}, "-2147483648"},
		{[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, "9223372036854775807"},
		{[]byte{0, 0, 0, 0, 0, 0, 0, 0x80}, "-9223372036854775808"},
		{[]byte{0, 0, 0, 0, 0, 0, 0, 0x80, 0}, "9223372036854775808"},
		{[]byte{0, 0, 0, 0, 0, 0, 0, 0x80, 0xff}, "-9223372036854775808"},
		{[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff}, "-9223372036854775809"},
	} {
		assert.Equal(t, tc.want, Repr(decodeLong(tc.in)), "% x", tc.in)
	}
	_, ok := decodeLong([]byte{0, 0, 0, 0, 0, 0, 0, 0x80, 0xff}).(int64)
	assert.True(t, ok, "a 9-byte long that fits is an int64")
}

func FuzzDecode(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.pkl")
	for _, p := range files {
		b, err := os.ReadFile(p)
		require.NoError(f, err)
		f.Add(b)
	}
	for _, tc := range hostile {
		f.Add([]byte(tc.in))
	}
	opts := Options{MaxInputBytes: 1 << 20, MaxStringLen: 1 << 16, MaxItems: 1 << 16,
		MaxDepth: 64, MaxStack: 1 << 12, MaxMemo: 1 << 12,
		PersistentLoad: func(pid any) (any, error) { return pid, nil }}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := DecodeBytes(data, opts)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *pickle.Error", err)
			}
			return
		}
		_ = Repr(v)
		if d, ok := v.(*Dict); ok {
			for _, it := range d.Items() {
				d.Get(it.Key)
			}
		}
	})
}

// A container that holds itself is written once, then "...", where it
// recurs on its own path (and again in full on a sibling path).
func TestReprOfCycles(t *testing.T) {
	for _, tc := range []struct{ hex, repr string }{
		// l = []; l.append(l); pickle.dumps(l, 2)
		{"80025d71006800612e", "[...]"},
		// d = {}; d["me"] = d; d["l"] = [l, l]
		{"80027d71002858020000006d657101680058010000006c71025d7103285d7104680461680465752e", `{"me": ..., "l": [[...], [...]]}`},
	} {
		b, err := hex.DecodeString(tc.hex)
		require.NoError(t, err)
		v, err := DecodeBytes(b, Options{})
		require.NoError(t, err)
		assert.Equal(t, tc.repr, Repr(v))
	}
}
