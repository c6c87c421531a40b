package safetensors

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"unicode/utf16"
	"unicode/utf8"
)

// parseHeader parses the JSON header strictly: it must start with '{', be
// valid UTF-8 with no unpaired surrogate escapes, be one JSON object (RFC
// 8259 grammar) with no duplicate keys at any level, and be followed by
// nothing but spaces. Entries are returned in JSON order; offsets are not
// checked here. index maps each tensor name to its position in Tensors.
// tmp, when not nil, is a buffer to unescape strings into, kept for the next
// call; nothing returned refers to buf or tmp.
//
// It is a scanner built for this one shape of document, not a general JSON
// decoder: a header of a large sharded checkpoint holds hundreds of entries
// and a __metadata__ string of escaped JSON, and a tokenizer that boxes every
// token costs more than the read. The shapes of all entries share one slab;
// a name without escapes is the only allocation per entry.
func parseHeader(buf []byte, tmp *[]byte) (*Header, error) {
	if len(buf) == 0 || buf[0] != '{' {
		return nil, headerErr("header does not start with '{'")
	}
	if !utf8.Valid(buf) {
		return nil, headerErr("header is not valid UTF-8")
	}
	// Every entry has one data_offsets key (unless escaped or malformed):
	// size the tables once.
	n := bytes.Count(buf, []byte(`"data_offsets"`))
	s := &scanner{buf: buf, i: 1, slab: make([]int64, 0, 3*n+1)}
	if tmp != nil {
		s.tmp = *tmp
		defer func() { *tmp = s.tmp }()
	}
	h := &Header{}
	if n > 0 {
		h.Tensors = make([]TensorInfo, 0, n)
	}
	h.index = make(map[string]int, n)
	haveMeta := false
	err := s.object("", "header", func(key []byte) error {
		if string(key) == metadataKey {
			if haveMeta {
				return headerErr("duplicate key %q", metadataKey)
			}
			haveMeta = true
			m, err := s.metadata()
			h.Metadata = m
			return err
		}
		if _, dup := h.index[string(key)]; dup {
			return headerErr("duplicate key %q", key)
		}
		name := string(key)
		t, err := s.entry(name)
		if err != nil {
			return err
		}
		h.index[name] = len(h.Tensors)
		h.Tensors = append(h.Tensors, t)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i := s.i; i < len(buf); i++ {
		if buf[i] != ' ' {
			return nil, headerErr("byte %q at header offset %d after the JSON object; only spaces may pad the header", buf[i], i)
		}
	}
	return h, nil
}

// scanner reads the header's JSON from buf at i.
type scanner struct {
	buf  []byte
	i    int
	tmp  []byte  // unescaped string; valid until the next string is read
	slab []int64 // backing store of every entry's shape
}

// syntax reports malformed JSON at the current offset; tensor, when set,
// names the entry being read.
func (s *scanner) syntax(tensor, where, format string, args ...any) error {
	var cause error
	if s.i >= len(s.buf) {
		cause = io.ErrUnexpectedEOF
		format = "unexpected end of JSON input"
		args = nil
	}
	e := &HeaderError{Tensor: tensor, Err: cause,
		Reason: fmt.Sprintf("malformed JSON in %s at offset %d: ", where, s.i) + fmt.Sprintf(format, args...)}
	if tensor != "" {
		e.Reason = fmt.Sprintf("tensor %q: ", tensor) + e.Reason
	}
	return e
}

func (s *scanner) ws() {
	for s.i < len(s.buf) {
		switch s.buf[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte, or 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.i >= len(s.buf) {
		return 0
	}
	return s.buf[s.i]
}

// object reads an object whose '{' is at i-1 (already consumed), calling
// member with each key, positioned at the member's value, which member must
// consume.
func (s *scanner) object(tensor, where string, member func(key []byte) error) error {
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		if s.peek() != '"' {
			return s.syntax(tensor, where, "want a string key, got %s", s.near())
		}
		key, err := s.str(tensor, where)
		if err != nil {
			return err
		}
		if s.peek() != ':' {
			return s.syntax(tensor, where, "want ':' after a key, got %s", s.near())
		}
		s.i++
		s.ws()
		if err := member(key); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return s.syntax(tensor, where, "want ',' or '}' after a member, got %s", s.near())
		}
	}
}

// near describes the byte at i for a syntax error.
func (s *scanner) near() string {
	if s.i >= len(s.buf) {
		return "end of input"
	}
	return fmt.Sprintf("%q", s.buf[s.i])
}

// str reads the string at i (at its '"') and returns its unescaped bytes,
// which alias buf or s.tmp. Control characters must be escaped; an escaped
// UTF-16 surrogate must be a high one directly followed by a low one (serde
// rejects what encoding/json would replace with U+FFFD).
func (s *scanner) str(tensor, where string) ([]byte, error) {
	start := s.i + 1
	i := start
	for i < len(s.buf) {
		c := s.buf[i]
		if c == '"' {
			s.i = i + 1
			return s.buf[start:i], nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			s.i = i
			return nil, s.syntax(tensor, where, "control character %q in a string", c)
		}
		i++
	}
	out := append(s.tmp[:0], s.buf[start:i]...)
	for {
		if i >= len(s.buf) {
			s.i = i
			return nil, s.syntax(tensor, where, "")
		}
		c := s.buf[i]
		switch {
		case c == '"':
			s.i = i + 1
			s.tmp = out
			return out, nil
		case c < 0x20:
			s.i = i
			return nil, s.syntax(tensor, where, "control character %q in a string", c)
		case c != '\\':
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(s.buf) {
			s.i = i + 1
			return nil, s.syntax(tensor, where, "")
		}
		switch e := s.buf[i+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hexRune(s.buf, i+2)
			if !ok {
				s.i = i
				return nil, s.syntax(tensor, where, "invalid \\u escape")
			}
			if utf16.IsSurrogate(r) {
				lo := rune(-1)
				if r < 0xDC00 && i+7 < len(s.buf) && s.buf[i+6] == '\\' && s.buf[i+7] == 'u' {
					lo, _ = hexRune(s.buf, i+8)
				}
				if lo < 0xDC00 || lo > 0xDFFF {
					return nil, headerErr("unpaired UTF-16 surrogate escape at header offset %d", i)
				}
				r = utf16.DecodeRune(r, lo)
				i += 6
			}
			out = utf8.AppendRune(out, r)
			i += 6
			continue
		default:
			s.i = i
			return nil, s.syntax(tensor, where, "invalid escape %q", e)
		}
		i += 2
	}
}

// hexRune reads four hex digits at buf[i:].
func hexRune(buf []byte, i int) (rune, bool) {
	if i+4 > len(buf) {
		return 0, false
	}
	var r rune
	for _, c := range buf[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// number reads the JSON number at i and returns its text.
func (s *scanner) number(tensor, where string) ([]byte, error) {
	start := s.i
	i := s.i
	digits := func() bool {
		j := i
		for i < len(s.buf) && s.buf[i] >= '0' && s.buf[i] <= '9' {
			i++
		}
		return i > j
	}
	if i < len(s.buf) && s.buf[i] == '-' {
		i++
	}
	switch {
	case i < len(s.buf) && s.buf[i] == '0':
		i++
	case !digits():
		s.i = i
		return nil, s.syntax(tensor, where, "invalid number")
	}
	if i < len(s.buf) && s.buf[i] == '.' {
		i++
		if !digits() {
			s.i = i
			return nil, s.syntax(tensor, where, "invalid number")
		}
	}
	if i < len(s.buf) && (s.buf[i] == 'e' || s.buf[i] == 'E') {
		i++
		if i < len(s.buf) && (s.buf[i] == '+' || s.buf[i] == '-') {
			i++
		}
		if !digits() {
			s.i = i
			return nil, s.syntax(tensor, where, "invalid number")
		}
	}
	s.i = i
	return s.buf[start:i], nil
}

// describe reads the value at i, which is not of the type wanted, and names
// it for an error message ("number 1", "an object"); a malformed value is a
// syntax error.
func (s *scanner) describe(tensor, where string) (string, error) {
	switch c := s.peek(); c {
	case '{':
		return "an object", nil
	case '[':
		return "an array", nil
	case '"':
		v, err := s.str(tensor, where)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("string %q", v), nil
	case 't', 'f', 'n':
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(s.buf[s.i:], []byte(lit)) {
				s.i += len(lit)
				return lit, nil
			}
		}
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		v, err := s.number(tensor, where)
		if err != nil {
			return "", err
		}
		return "number " + string(v), nil
	}
	return "", s.syntax(tensor, where, "want a value, got %s", s.near())
}

// wrongType returns the error for a value at i of the wrong type: what
// describe names, or its syntax error.
func (s *scanner) wrongType(tensor, where string, mk func(what string) error) error {
	what, err := s.describe(tensor, where)
	if err != nil {
		return err
	}
	return mk(what)
}

// metadata reads the "__metadata__" object: string keys to string values.
func (s *scanner) metadata() (map[string]string, error) {
	const where = metadataKey
	if s.peek() != '{' {
		return nil, s.wrongType("", where, func(what string) error {
			return headerErr("%s is %s, not an object of strings", metadataKey, what)
		})
	}
	s.i++
	m := map[string]string{}
	err := s.object("", where, func(key []byte) error {
		k := string(key)
		if _, dup := m[k]; dup {
			return headerErr("%s: duplicate key %q", metadataKey, k)
		}
		if s.peek() != '"' {
			return s.wrongType("", where, func(what string) error {
				return headerErr("%s key %q: value is %s, not a string", metadataKey, k, what)
			})
		}
		v, err := s.str("", where)
		if err != nil {
			return err
		}
		m[k] = string(v)
		return nil
	})
	return m, err
}

// entry reads one tensor entry: an object with exactly "dtype", "shape" and
// "data_offsets".
func (s *scanner) entry(name string) (TensorInfo, error) {
	t := TensorInfo{Name: name}
	if s.peek() != '{' {
		return t, s.wrongType(name, "entry", func(what string) error {
			return tensorErr(name, "entry is %s, not an object", what)
		})
	}
	s.i++
	var haveDType, haveShape, haveOffsets bool
	err := s.object(name, "entry", func(key []byte) error {
		var dup bool
		var err error
		switch string(key) {
		case "dtype":
			dup, haveDType = haveDType, true
			if !dup {
				t.DType, err = s.dtype(name)
			}
		case "shape":
			dup, haveShape = haveShape, true
			if !dup {
				start := len(s.slab)
				s.slab, err = s.ints(name, "shape", s.slab, -1)
				t.Shape = s.slab[start:len(s.slab):len(s.slab)]
			}
		case "data_offsets":
			dup, haveOffsets = haveOffsets, true
			if !dup {
				var offs [2]int64
				_, err = s.ints(name, "data_offsets", offs[:0], 2)
				t.Begin, t.End = offs[0], offs[1]
			}
		default:
			return tensorErr(name, "unknown field %q; an entry has exactly dtype, shape and data_offsets", key)
		}
		if err == nil && dup {
			err = tensorErr(name, "duplicate field %q", key)
		}
		return err
	})
	if err != nil {
		return t, err
	}
	var missing []byte
	for _, f := range []struct {
		have bool
		name string
	}{{haveDType, "dtype"}, {haveShape, "shape"}, {haveOffsets, "data_offsets"}} {
		if !f.have {
			if len(missing) > 0 {
				missing = append(missing, ", "...)
			}
			missing = append(missing, f.name...)
		}
	}
	if len(missing) > 0 {
		return t, tensorErr(name, "missing field %s", missing)
	}
	return t, nil
}

// knownDTypes lets dtype return the constant, not a copy of the bytes.
var knownDTypes = func() map[string]DType {
	m := make(map[string]DType, len(dtypes))
	for d := range dtypes {
		m[string(d)] = d
	}
	return m
}()

func (s *scanner) dtype(name string) (DType, error) {
	if s.peek() != '"' {
		return "", s.wrongType(name, "dtype", func(what string) error {
			return tensorErr(name, "dtype is %s, not a string", what)
		})
	}
	v, err := s.str(name, "dtype")
	if err != nil {
		return "", err
	}
	d, ok := knownDTypes[string(v)]
	if !ok {
		return "", tensorErr(name, "unknown dtype %q", v)
	}
	return d, nil
}

// ints reads an array of non-negative integers below 2^63, appending them
// to out; n >= 0 requires exactly n elements, and out has room for them.
func (s *scanner) ints(name, field string, out []int64, n int) ([]int64, error) {
	if s.peek() != '[' {
		return out, s.wrongType(name, field, func(what string) error {
			return tensorErr(name, "%s is %s, not an array", field, what)
		})
	}
	s.i++
	count := 0
	if s.peek() == ']' {
		s.i++
	} else {
		for {
			c := s.peek()
			if c != '-' && (c < '0' || c > '9') {
				return out, s.wrongType(name, field, func(what string) error {
					return tensorErr(name, "%s[%d] is %s, not an integer", field, count, what)
				})
			}
			num, err := s.number(name, field)
			if err != nil {
				return out, err
			}
			v, ok := parseUint(num)
			if !ok {
				return out, tensorErr(name, "%s[%d] is %s, not a non-negative integer below 2^63", field, count, num)
			}
			if n < 0 || count < n {
				out = append(out, v)
			}
			count++
			switch s.peek() {
			case ',':
				s.i++
				continue
			case ']':
				s.i++
			default:
				return out, s.syntax(name, field, "want ',' or ']' after an element, got %s", s.near())
			}
			break
		}
	}
	if n >= 0 && count != n {
		return out, tensorErr(name, "%s has %d elements, want %d", field, count, n)
	}
	return out, nil
}

// parseUint accepts exactly the JSON integers 0..MaxInt64: digits only, no
// sign, fraction or exponent (serde rejects those for usize, and "-0").
func parseUint(num []byte) (int64, bool) {
	if len(num) == 0 {
		return 0, false
	}
	var v int64
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if v > (math.MaxInt64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}
