package safetensors

// The header parser on encoding/json's tokenizer that scan.go replaced, kept
// as the oracle of FuzzParseHeaderDifferential.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// refParseHeader parses the JSON header strictly: it must start with '{', be
// valid UTF-8 with no unpaired surrogate escapes, be one JSON object with no
// duplicate keys at any level, and be followed by nothing but spaces. Entries
// are returned in JSON order; offsets are not checked here.
func refParseHeader(buf []byte) (*Header, error) {
	if len(buf) == 0 || buf[0] != '{' {
		return nil, headerErr("header does not start with '{'")
	}
	if !utf8.Valid(buf) {
		return nil, headerErr("header is not valid UTF-8")
	}
	if off, ok := checkSurrogates(buf); !ok {
		return nil, headerErr("unpaired UTF-16 surrogate escape at header offset %d", off)
	}
	p := &refParser{dec: json.NewDecoder(bytes.NewReader(buf))}
	p.dec.UseNumber()

	h := &Header{}
	if err := p.delim('{', "header"); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for p.dec.More() {
		key, err := p.key("header")
		if err != nil {
			return nil, err
		}
		if seen[key] {
			return nil, headerErr("duplicate key %q", key)
		}
		seen[key] = true
		if key == metadataKey {
			if h.Metadata, err = p.metadata(); err != nil {
				return nil, err
			}
			continue
		}
		t, err := p.entry(key)
		if err != nil {
			return nil, err
		}
		h.Tensors = append(h.Tensors, t)
	}
	if err := p.delim('}', "header"); err != nil {
		return nil, err
	}
	end := p.dec.InputOffset()
	if i := bytes.IndexFunc(buf[end:], func(r rune) bool { return r != ' ' }); i >= 0 {
		return nil, headerErr("byte %q at header offset %d after the JSON object; only spaces may pad the header", buf[end+int64(i)], end+int64(i))
	}
	return h, nil
}

type refParser struct {
	dec *json.Decoder
}

// token reads the next token; where names the JSON value being read, for
// error messages.
func (p *refParser) token(tensor, where string) (json.Token, error) {
	tok, err := p.dec.Token()
	if err != nil {
		var serr *json.SyntaxError
		if errors.As(err, &serr) {
			return nil, p.err(tensor, err, "malformed JSON in %s at offset %d: %v", where, serr.Offset, err)
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, p.err(tensor, err, "malformed JSON in %s: %v", where, err)
	}
	return tok, nil
}

func (p *refParser) err(tensor string, cause error, format string, args ...any) error {
	e := &HeaderError{Tensor: tensor, Reason: fmt.Sprintf(format, args...), Err: cause}
	if tensor != "" {
		e.Reason = fmt.Sprintf("tensor %q: ", tensor) + e.Reason
	}
	return e
}

func (p *refParser) delim(want json.Delim, where string) error {
	return p.delimIn("", want, where)
}

func (p *refParser) delimIn(tensor string, want json.Delim, where string) error {
	tok, err := p.token(tensor, where)
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return p.err(tensor, nil, "%s: want %q, got %s", where, string(want), describe(tok))
	}
	return nil
}

func (p *refParser) key(where string) (string, error) {
	return p.keyIn("", where)
}

func (p *refParser) keyIn(tensor, where string) (string, error) {
	tok, err := p.token(tensor, where)
	if err != nil {
		return "", err
	}
	s, ok := tok.(string)
	if !ok { // cannot happen: the decoder only yields strings in key position
		return "", p.err(tensor, nil, "%s: want a key, got %s", where, describe(tok))
	}
	return s, nil
}

// metadata parses the "__metadata__" object: string keys to string values.
func (p *refParser) metadata() (map[string]string, error) {
	const where = metadataKey
	tok, err := p.token("", where)
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, headerErr("%s is %s, not an object of strings", metadataKey, describe(tok))
	}
	m := map[string]string{}
	for p.dec.More() {
		k, err := p.key(where)
		if err != nil {
			return nil, err
		}
		if _, dup := m[k]; dup {
			return nil, headerErr("%s: duplicate key %q", metadataKey, k)
		}
		tok, err := p.token("", where)
		if err != nil {
			return nil, err
		}
		v, ok := tok.(string)
		if !ok {
			return nil, headerErr("%s key %q: value is %s, not a string", metadataKey, k, describe(tok))
		}
		m[k] = v
	}
	if err := p.delim('}', where); err != nil {
		return nil, err
	}
	return m, nil
}

// entry parses one tensor entry: an object with exactly "dtype", "shape" and
// "data_offsets".
func (p *refParser) entry(name string) (TensorInfo, error) {
	t := TensorInfo{Name: name}
	tok, err := p.token(name, "entry")
	if err != nil {
		return t, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return t, tensorErr(name, "entry is %s, not an object", describe(tok))
	}
	var haveDType, haveShape, haveOffsets bool
	for p.dec.More() {
		k, err := p.keyIn(name, "entry")
		if err != nil {
			return t, err
		}
		var dup bool
		switch k {
		case "dtype":
			dup, haveDType = haveDType, true
			if !dup {
				if t.DType, err = p.dtype(name); err != nil {
					return t, err
				}
			}
		case "shape":
			dup, haveShape = haveShape, true
			if !dup {
				if t.Shape, err = p.ints(name, "shape", -1); err != nil {
					return t, err
				}
			}
		case "data_offsets":
			dup, haveOffsets = haveOffsets, true
			if !dup {
				offs, err := p.ints(name, "data_offsets", 2)
				if err != nil {
					return t, err
				}
				t.Begin, t.End = offs[0], offs[1]
			}
		default:
			return t, tensorErr(name, "unknown field %q; an entry has exactly dtype, shape and data_offsets", k)
		}
		if dup {
			return t, tensorErr(name, "duplicate field %q", k)
		}
	}
	if err := p.delimIn(name, '}', "entry"); err != nil {
		return t, err
	}
	var missing []string
	for _, f := range []struct {
		have bool
		name string
	}{{haveDType, "dtype"}, {haveShape, "shape"}, {haveOffsets, "data_offsets"}} {
		if !f.have {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return t, tensorErr(name, "missing field %s", strings.Join(missing, ", "))
	}
	return t, nil
}

func (p *refParser) dtype(name string) (DType, error) {
	tok, err := p.token(name, "dtype")
	if err != nil {
		return "", err
	}
	s, ok := tok.(string)
	if !ok {
		return "", tensorErr(name, "dtype is %s, not a string", describe(tok))
	}
	d := DType(s)
	if !d.Known() {
		return "", tensorErr(name, "unknown dtype %q", s)
	}
	return d, nil
}

// ints parses an array of non-negative integers; n >= 0 requires exactly n
// elements. The result is never nil.
func (p *refParser) ints(name, field string, n int) ([]int64, error) {
	tok, err := p.token(name, field)
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, tensorErr(name, "%s is %s, not an array", field, describe(tok))
	}
	out := []int64{}
	for p.dec.More() {
		tok, err := p.token(name, field)
		if err != nil {
			return nil, err
		}
		num, ok := tok.(json.Number)
		if !ok {
			return nil, tensorErr(name, "%s[%d] is %s, not an integer", field, len(out), describe(tok))
		}
		v, ok := parseUint([]byte(num))
		if !ok {
			return nil, tensorErr(name, "%s[%d] is %s, not a non-negative integer below 2^63", field, len(out), num)
		}
		out = append(out, v)
	}
	if err := p.delimIn(name, ']', field); err != nil {
		return nil, err
	}
	if n >= 0 && len(out) != n {
		return nil, tensorErr(name, "%s has %d elements, want %d", field, len(out), n)
	}
	return out, nil
}

func describe(tok json.Token) string {
	switch v := tok.(type) {
	case nil:
		return "null"
	case json.Delim:
		switch v {
		case '{':
			return "an object"
		case '[':
			return "an array"
		}
		return fmt.Sprintf("%q", string(v))
	case string:
		return fmt.Sprintf("string %q", v)
	case json.Number:
		return "number " + string(v)
	case bool:
		return fmt.Sprintf("%t", v)
	}
	return fmt.Sprintf("%v", tok)
}

// checkSurrogates reports whether every \uXXXX escape for a UTF-16 surrogate
// in buf is a high surrogate directly followed by a low one, as serde_json
// requires (encoding/json would silently substitute U+FFFD). It returns the
// offset of the first bad escape. Only meaningful for syntactically valid
// JSON, which the decoder checks afterwards.
func checkSurrogates(buf []byte) (int, bool) {
	inString := false
	for i := 0; i < len(buf); i++ {
		c := buf[i]
		if !inString {
			if c == '"' {
				inString = true
			}
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if i+1 < len(buf) && buf[i+1] == 'u' {
				r, ok := hex4(buf, i+2)
				switch {
				case !ok:
					// Malformed escape: the decoder reports it.
				case r >= 0xDC00 && r <= 0xDFFF:
					return i, false
				case r >= 0xD800 && r <= 0xDBFF:
					lo, ok := -1, i+7 < len(buf) && buf[i+6] == '\\' && buf[i+7] == 'u'
					if ok {
						lo, ok = hex4(buf, i+8)
					}
					if !ok || lo < 0xDC00 || lo > 0xDFFF {
						return i, false
					}
					i += 11
					continue
				}
				i += 5
				continue
			}
			i++ // skip the escaped character
		}
	}
	return 0, true
}

func hex4(buf []byte, i int) (int, bool) {
	if i+4 > len(buf) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(buf[i:i+4]), 16, 16)
	return int(v), err == nil
}
