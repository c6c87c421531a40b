package pickle

import (
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recSink takes the objects of its classes both ways: as records, and as
// Objects built the general way, which it reads into the same text. So a
// decoding through records and one without them (the same sink, records
// hidden) must give the same result, or the same error.
type recSink struct {
	classes map[string]bool // class names taken
	records int             // taken as records
	objects int             // taken as objects
	fail    string          // a class whose objects the sink fails on
}

// noRecords hides a recSink's RecordSink methods.
type noRecords struct{ Sink }

var errRecord = errors.New("refused")

func (s *recSink) RecordClass(g Global) int {
	if s.classes[g.Name] {
		return 1
	}
	return 0
}

func (s *recSink) BuiltRecord(r *Record) (any, bool, error) {
	if r.Class.Name == s.fail {
		return nil, false, errRecord
	}
	var fields []string
	for i := range r.Len() {
		f := r.At(i)
		g, ok := r.Field(f.Name)
		if !ok || fieldText(g) != fieldText(f) {
			return nil, false, fmt.Errorf("field %d is %s, field %q %s", i, fieldText(f), f.Name, fieldText(g))
		}
		fields = append(fields, strconv.Quote(f.Name)+": "+fieldText(f))
	}
	s.records++
	return r.Class.String() + "{" + strings.Join(fields, ", ") + "}", true, nil
}

// fieldText is a field's value as valueText writes the same value.
func fieldText(f Field) string {
	switch f.Kind() {
	case KindInt:
		return strconv.FormatInt(f.Int(), 10)
	case KindStr:
		return strconv.Quote(f.Str())
	case KindInts:
		return fmt.Sprint(f.Ints())
	case KindCall:
		return f.Func().String() + fmt.Sprint(f.Ints())
	case KindStrs:
		return fmt.Sprintf("%q", f.Strs())
	}
	return "None"
}

// Built reads obj into what BuiltRecord makes of the same object: the
// specification of what a record is.
func (s *recSink) Built(obj *Object) (any, bool, error) {
	if !s.classes[obj.Class.Name] || !obj.NewObj || len(obj.Args) != 0 || obj.Extra != nil {
		return nil, false, nil
	}
	if obj.Class.Name == s.fail {
		return nil, false, errRecord
	}
	st, ok := obj.State.(*Dict)
	if !ok {
		return nil, false, nil
	}
	var fields []string
	for _, it := range st.Items() {
		k, ok := it.Key.(string)
		if !ok {
			return nil, false, nil
		}
		text, ok := valueText(it.Value)
		if !ok {
			return nil, false, nil
		}
		fields = append(fields, strconv.Quote(k)+": "+text)
	}
	s.objects++
	return obj.Class.String() + "{" + strings.Join(fields, ", ") + "}", true, nil
}

// valueText is v as a record's field, if it is one.
func valueText(v any) (string, bool) {
	ints := func(v any) (string, bool) {
		t, ok := v.(Tuple)
		if !ok {
			return "", false
		}
		out := []int64{}
		for _, it := range t {
			switch x := it.(type) {
			case int64:
				out = append(out, x)
			case *big.Int:
				if !x.IsInt64() {
					return "", false
				}
				out = append(out, x.Int64())
			default:
				return "", false
			}
		}
		return fmt.Sprint(out), true
	}
	switch x := v.(type) {
	case nil:
		return "None", true
	case int64:
		return strconv.FormatInt(x, 10), true
	case string:
		return strconv.Quote(x), true
	case Tuple:
		return ints(x)
	case *Object:
		if x.NewObj || x.Extra != nil || x.State != nil || len(x.Args) != 1 {
			return "", false
		}
		is, ok := ints(x.Args[0])
		return x.Class.String() + is, ok
	case *List:
		var strs []string
		for _, it := range x.Items {
			s, ok := it.(string)
			if !ok {
				return "", false
			}
			strs = append(strs, s)
		}
		return fmt.Sprintf("%q", strs), true
	}
	return "", false
}

func (s *recSink) SetItem(*Dict, any, any) (bool, error) { return false, nil }

// checkRecords decodes data with records and without, and requires the
// same result or the same error. It returns the sink that had records.
func checkRecords(t *testing.T, data []byte, opts Options, classes ...string) *recSink {
	set := map[string]bool{}
	for _, c := range classes {
		set[c] = true
	}
	plain := &recSink{classes: set, fail: "Fail"}
	opts.Sink = noRecords{plain}
	want, werr := DecodeBytes(data, opts)
	rec := &recSink{classes: set, fail: "Fail"}
	opts.Sink = rec
	got, err := DecodeBytes(data, opts)
	if werr != nil {
		require.Error(t, err, "decoded %s", Repr(got))
		assert.Equal(t, werr.Error(), err.Error())
		assert.Equal(t, errors.Is(werr, ErrLimit), errors.Is(err, ErrLimit))
		assert.Equal(t, errors.Is(werr, errRecord), errors.Is(err, errRecord))
		return rec
	}
	require.NoError(t, err)
	assert.Equal(t, Repr(want), Repr(got))
	assert.Equal(t, plain.objects, rec.objects+rec.records, "objects taken")
	return rec
}

// metadataSeeds are .metadata pickles written by torch (protocol 4, the
// memo) and by EncodeMetadata (protocol 2, no memo).
func metadataSeeds(t testing.TB) [][]byte {
	var out [][]byte
	for _, p := range []string{"../torchdcp/testdata/plain/.metadata", "../torchdcp/testdata/zstd/.metadata",
		"../torchdcp/testdata/sharded/.metadata", "../dcpwrite/testdata/golden.metadata"} {
		b, err := os.ReadFile(filepath.FromSlash(p))
		require.NoError(t, err)
		out = append(out, b)
	}
	return out
}

var metadataClasses = []string{"ChunkStorageMetadata", "MetadataIndex", "_StorageInfo", "C", "Fail"}

// Every chunk, index and storage info of a real .metadata is read as a
// record, to what the general VM builds.
func TestRecordsOfMetadata(t *testing.T) {
	for i, b := range metadataSeeds(t) {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			s := checkRecords(t, b, Options{}, metadataClasses...)
			assert.Positive(t, s.records)
			assert.Zero(t, s.objects, "objects decoded the general way")
		})
	}
}

// recPickle is a protocol-2 pickle of [C(state), ...] where C's state is
// the dict whose items are written by items (opcodes).
func recPickle(items ...string) string {
	var b strings.Builder
	b.WriteString("\x80\x02](")
	for _, it := range items {
		b.WriteString("cm\nC\n)\x81}(" + it + "ub")
	}
	b.WriteString("e.")
	return b.String()
}

// The shapes a record takes and those it leaves to the general VM, each
// decoded both ways.
func TestRecordShapes(t *testing.T) {
	size := "ctorch\nSize\n"
	for _, tc := range []struct {
		name   string
		in     string
		opts   Options
		record bool // taken as a record
	}{
		{"ints and strs", recPickle("X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00bJ\xff\xff\xff\xffX\x01\x00\x00\x00c\x8c\x02hi"), Options{}, true},
		{"torch.Size", recPickle("X\x01\x00\x00\x00a" + size + "K\x02K\x03\x86\x85R"), Options{}, true},
		{"0-dim torch.Size", recPickle("X\x01\x00\x00\x00a" + size + ")\x85R"), Options{}, true},
		{"bare tuple, None, LONG1", recPickle("X\x01\x00\x00\x00a(K\x01K\x02K\x03K\x04tX\x01\x00\x00\x00bNX\x01\x00\x00\x00c\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f"), Options{}, true},
		{"list of strs", recPickle("X\x01\x00\x00\x00a](X\x01\x00\x00\x00xX\x01\x00\x00\x00yeX\x01\x00\x00\x00b]X\x01\x00\x00\x00za"), Options{}, true},
		{"a string got again in its own record", recPickle("X\x01\x00\x00\x00aq\x00h\x00X\x01\x00\x00\x00bq\x01K\x01X\x01\x00\x00\x00cj\x01\x00\x00\x00"), Options{}, true},
		{"key set twice", recPickle("X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00aK\x02"), Options{}, true},
		{"memo: strings and a torch.Size got again", "\x80\x02](cm\nC\n)\x81}(X\x01\x00\x00\x00aq\x00" + size + "q\x01K\x02\x85\x85Rq\x02ubcm\nC\n)\x81}(h\x00h\x02X\x01\x00\x00\x00bh\x01K\x07\x85\x85RubX\x01\x00\x00\x00zh\x02e.", Options{}, true},
		{"an int key", recPickle("K\x01K\x02"), Options{}, false},
		{"a float", recPickle("X\x01\x00\x00\x00aG\x3f\xf0\x00\x00\x00\x00\x00\x00"), Options{}, false},
		{"a nested dict", recPickle("X\x01\x00\x00\x00a}"), Options{}, false},
		{"a list of ints", recPickle("X\x01\x00\x00\x00a](K\x01e"), Options{}, false},
		{"a big LONG1", recPickle("X\x01\x00\x00\x00a\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01"), Options{}, false},
		{"the object got again", "\x80\x02](cm\nC\n)\x81q\x00}(X\x01\x00\x00\x00aK\x01ubh\x00e.", Options{}, false},
		{"the state got again", "\x80\x02](cm\nC\n)\x81}q\x00(X\x01\x00\x00\x00aK\x01ubh\x00e.", Options{}, false},
		{"a tuple got again", "\x80\x02](cm\nC\n)\x81}(X\x01\x00\x00\x00aK\x01\x85q\x00ubh\x00e.", Options{}, true},
		{"a list got again", "\x80\x02](cm\nC\n)\x81}(X\x01\x00\x00\x00a]q\x00ubh\x00e.", Options{}, false},
		{"a call of something else", recPickle("X\x01\x00\x00\x00acm\nf\nK\x01\x85\x85R"), Options{}, true},
		{"a call with two arguments", recPickle("X\x01\x00\x00\x00a" + size + "K\x01K\x02\x86R"), Options{}, false},
		{"arguments to NEWOBJ", "\x80\x02cm\nC\nK\x01\x85\x81}(X\x01\x00\x00\x00aK\x01ub.", Options{}, false},
		{"a dict state under a mark", "\x80\x02cm\nC\n)\x81(}b.", Options{}, false},
		{"BUILD without a state", "\x80\x02cm\nC\n)\x81b.", Options{}, false},
		{"SETITEMS on the object", "\x80\x02cm\nC\n)\x81(X\x01\x00\x00\x00aK\x01u}b.", Options{}, false},
		{"truncated", "\x80\x02cm\nC\n)\x81}(X\x01\x00\x00\x00aK", Options{}, false},
		{"no STOP after it", "\x80\x02cm\nC\n)\x81}b", Options{}, false},
		{"a get of an entry never put", recPickle("X\x01\x00\x00\x00ah\x05"), Options{}, false},
		{"a put out of order", recPickle("X\x01\x00\x00\x00aq\x07K\x01"), Options{}, false},
		{"frame inside", recPickle("X\x01\x00\x00\x00a\x95\x01\x00\x00\x00\x00\x00\x00\x00K\x01"), Options{}, true},
		{"the sink fails", "\x80\x02cm\nFail\n)\x81}b.", Options{}, false},
		// Limits: the record is left to the VM where it could hit one.
		{"items just enough", recPickle("X\x01\x00\x00\x00aK\x01"), Options{MaxItems: 5}, true},
		// The list's APPENDS is the 5th item: the record is taken, and the VM fails after it.
		{"items one short", recPickle("X\x01\x00\x00\x00aK\x01"), Options{MaxItems: 4}, true},
		{"items short inside the record", recPickle("X\x01\x00\x00\x00aK\x01"), Options{MaxItems: 3}, false},
		// With a sink, MaxMemo counts the entries gotten again (none here).
		{"memo puts past the limit", "\x80\x02cm\nC\n)\x81q\x00}q\x01(X\x01\x00\x00\x00aq\x02K\x01ub.", Options{MaxMemo: 2}, true},
		{"memo gets past the limit", "\x80\x02cm\nC\n)\x81q\x00}q\x01(X\x01\x00\x00\x00aq\x02K\x01ubh\x00h\x01h\x02l.", Options{MaxMemo: 2}, false},
		{"stack too small for a record", recPickle("X\x01\x00\x00\x00aK\x01"), Options{MaxStack: recStack}, false},
		{"depth too small for a record", recPickle("X\x01\x00\x00\x00aK\x01"), Options{MaxDepth: 3}, false},
		{"a long string", recPickle("X\x01\x00\x00\x00aX\x08\x00\x00\x00abcdefgh"), Options{MaxStringLen: 4}, false},
		{"too many fields", recPickle(strings.Repeat("X\x01\x00\x00\x00aK\x01", recFields+1)), Options{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := checkRecords(t, []byte(tc.in), tc.opts, "C", "Fail")
			assert.Equal(t, tc.record, s.records > 0, "taken as a record")
		})
	}
}

// FuzzRecords: with or without records, a decoding gives the same result
// or the same error.
func FuzzRecords(f *testing.F) {
	for _, b := range sinkSeeds(f) {
		f.Add(b)
	}
	for _, b := range metadataSeeds(f) {
		if len(b) <= 16<<10 {
			f.Add(b)
		}
	}
	opts := Options{MaxInputBytes: 1 << 20, MaxStringLen: 1 << 16, MaxItems: 1 << 16,
		MaxDepth: 64, MaxStack: 1 << 12, MaxMemo: 1 << 12,
		PersistentLoad: func(pid any) (any, error) { return pid, nil }}
	f.Fuzz(func(t *testing.T, data []byte) { checkRecords(t, data, opts, metadataClasses...) })
}
