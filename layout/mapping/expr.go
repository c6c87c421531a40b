package mapping

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/ckptfs/ckptfs/layout/internal/checked"
)

// maxExprDepth bounds nested parentheses: the parser recurses once per level.
const maxExprDepth = 64

// eval computes an integer expression over named parameters: integers,
// names, + - * / (integer division, exact: a remainder is an error) and
// parentheses, as in "heads/kv_heads*head_dim".
func eval(expr string, params map[string]int64) (int64, error) {
	p := &exprParser{src: expr, params: params}
	v, err := p.sum()
	if err == nil && p.peek() != 0 {
		err = fmt.Errorf("unexpected %q", p.src[p.pos:])
	}
	if err != nil {
		return 0, fmt.Errorf("expression %q: %w", expr, err)
	}
	return v, nil
}

type exprParser struct {
	src    string
	pos    int
	depth  int // open parentheses
	params map[string]int64
}

func (p *exprParser) peek() byte {
	for p.pos < len(p.src) && p.src[p.pos] == ' ' {
		p.pos++
	}
	if p.pos == len(p.src) {
		return 0
	}
	return p.src[p.pos]
}

func (p *exprParser) sum() (int64, error) {
	v, err := p.product()
	for err == nil {
		op := p.peek()
		if op != '+' && op != '-' {
			return v, nil
		}
		p.pos++
		var w int64
		if w, err = p.product(); err != nil {
			break
		}
		r, ok := checked.Add(v, w)
		if op == '-' {
			r, ok = checked.Sub(v, w)
		}
		if !ok {
			return 0, fmt.Errorf("%d%c%d overflows", v, op, w)
		}
		v = r
	}
	return 0, err
}

func (p *exprParser) product() (int64, error) {
	v, err := p.atom()
	for err == nil {
		op := p.peek()
		if op != '*' && op != '/' {
			return v, nil
		}
		p.pos++
		var w int64
		if w, err = p.atom(); err != nil {
			break
		}
		switch {
		case op == '*':
			r, ok := checked.Mul(v, w)
			if !ok {
				return 0, fmt.Errorf("%d*%d overflows", v, w)
			}
			v = r
		case w == 0:
			return 0, fmt.Errorf("division by zero")
		case w == -1:
			r, ok := checked.Mul(v, -1)
			if !ok {
				return 0, fmt.Errorf("%d/%d overflows", v, w)
			}
			v = r
		case v%w != 0:
			return 0, fmt.Errorf("%d is not a multiple of %d", v, w)
		default:
			v /= w
		}
	}
	return 0, err
}

func (p *exprParser) atom() (int64, error) {
	c := p.peek()
	switch {
	case c == '(':
		if p.depth++; p.depth > maxExprDepth {
			return 0, fmt.Errorf("more than %d nested parentheses", maxExprDepth)
		}
		p.pos++
		v, err := p.sum()
		p.depth--
		if err == nil && p.peek() != ')' {
			err = fmt.Errorf("missing )")
		}
		p.pos++
		return v, err
	case c >= '0' && c <= '9':
		end := p.pos
		for end < len(p.src) && p.src[end] >= '0' && p.src[end] <= '9' {
			end++
		}
		v, err := strconv.ParseInt(p.src[p.pos:end], 10, 64)
		p.pos = end
		return v, err
	case c == '_' || unicode.IsLetter(rune(c)):
		end := p.pos
		for end < len(p.src) && (p.src[end] == '_' || unicode.IsLetter(rune(p.src[end])) || unicode.IsDigit(rune(p.src[end]))) {
			end++
		}
		name := p.src[p.pos:end]
		p.pos = end
		v, ok := p.params[name]
		if !ok {
			return 0, &UnknownParamError{Name: name}
		}
		return v, nil
	}
	return 0, fmt.Errorf("unexpected %q", strings.TrimSpace(p.src[p.pos:]))
}

// UnknownParamError is returned when an expression needs a hyper-parameter
// the checkpoint and the config do not give.
type UnknownParamError struct{ Name string }

func (e *UnknownParamError) Error() string { return fmt.Sprintf("%s is not known", e.Name) }
