package mapping

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"sync"

	"github.com/ckptfs/ckptfs/layout/internal/checked"
)

// eval computes an integer expression over named parameters: decimal
// integers, names, + - * / (integer division, exact: a remainder is an
// error) and parentheses, as in "heads/kv_heads*head_dim". go/parser reads
// it; anything else Go's grammar allows (unary operators, calls, other
// literals) is refused.
func eval(expr string, params map[string]int64) (int64, error) {
	e, err := parse(expr)
	if err == nil {
		var v int64
		if v, err = (evaluator{params}).value(e, 0); err == nil {
			return v, nil
		}
	}
	if len(expr) > maxQuoted {
		expr = expr[:maxQuoted] + "..."
	}
	return 0, fmt.Errorf("expression %q: %w", expr, err)
}

// parsed holds the syntax trees of the expressions read so far: a rule's
// few expressions are evaluated once per tensor it maps, tens of thousands
// of times for a large MoE, and go/parser's cost dwarfs the evaluation.
// Trees are never changed after parsing, so they are shared.
var parsed struct {
	sync.Mutex
	m map[string]parsedExpr
}

type parsedExpr struct {
	e   ast.Expr
	err error
}

// maxParsed bounds the cache: mapping files hold a few dozen expressions,
// but a mount lives long and may read many files.
const maxParsed = 4096

func parse(expr string) (ast.Expr, error) {
	parsed.Lock()
	p, ok := parsed.m[expr]
	parsed.Unlock()
	if ok {
		return p.e, p.err
	}
	if strings.Contains(expr, "//") || strings.Contains(expr, "/*") {
		// go/parser would drop a comment: "heads//2" is no floor
		// division here.
		p.err = errors.New("a comment (// or /*) is not part of an expression")
	} else {
		p.e, p.err = parser.ParseExpr(expr)
	}
	parsed.Lock()
	if parsed.m == nil {
		parsed.m = map[string]parsedExpr{}
	}
	if len(parsed.m) < maxParsed && len(expr) <= maxQuoted {
		parsed.m[expr] = p
	}
	parsed.Unlock()
	return p.e, p.err
}

// maxQuoted bounds the expression an error quotes: one line, whatever the
// mapping file holds.
const maxQuoted = 80

// maxExprDepth bounds nested parentheses.
const maxExprDepth = 64

type evaluator struct{ params map[string]int64 }

func (ev evaluator) value(e ast.Expr, depth int) (int64, error) {
	switch e := e.(type) {
	case *ast.ParenExpr:
		if depth++; depth > maxExprDepth {
			return 0, fmt.Errorf("more than %d nested parentheses", maxExprDepth)
		}
		return ev.value(e.X, depth)
	case *ast.BasicLit:
		for _, c := range e.Value {
			if c < '0' || c > '9' {
				return 0, fmt.Errorf("unexpected %q: not a decimal integer", e.Value)
			}
		}
		if len(e.Value) > 1 && e.Value[0] == '0' {
			return 0, fmt.Errorf("%q has a leading zero (octal in Go, decimal elsewhere): write it without", e.Value)
		}
		return strconv.ParseInt(e.Value, 10, 64)
	case *ast.Ident:
		v, ok := ev.params[e.Name]
		if !ok {
			return 0, &UnknownParamError{Name: e.Name}
		}
		return v, nil
	case *ast.BinaryExpr:
		// A chain a+b+c+... is a tree as deep as it is long, down its left
		// side: that side is walked in a loop, so that recursion goes only
		// into parentheses (bounded) and operators of higher precedence.
		var chain []*ast.BinaryExpr
		var x ast.Expr = e
		for b, ok := x.(*ast.BinaryExpr); ok; b, ok = x.(*ast.BinaryExpr) {
			chain = append(chain, b)
			x = b.X
		}
		v, err := ev.value(x, depth)
		for i := len(chain) - 1; i >= 0 && err == nil; i-- {
			var w int64
			if w, err = ev.value(chain[i].Y, depth); err == nil {
				v, err = arith(chain[i].Op, v, w)
			}
		}
		return v, err
	}
	return 0, fmt.Errorf("unexpected %T: only integers, names, + - * / and parentheses", e)
}

// arith applies op to v and w, refusing what int64 cannot hold and a
// division that leaves a remainder.
func arith(op token.Token, v, w int64) (int64, error) {
	var r int64
	ok := true
	switch op {
	case token.ADD:
		r, ok = checked.Add(v, w)
	case token.SUB:
		r, ok = checked.Sub(v, w)
	case token.MUL:
		r, ok = checked.Mul(v, w)
	case token.QUO:
		switch {
		case w == 0:
			return 0, fmt.Errorf("division by zero")
		case w == -1:
			r, ok = checked.Mul(v, -1)
		case v%w != 0:
			return 0, fmt.Errorf("%d is not a multiple of %d", v, w)
		default:
			r = v / w
		}
	default:
		return 0, fmt.Errorf("unexpected operator %s: only + - * /", op)
	}
	if !ok {
		return 0, fmt.Errorf("%d%s%d overflows", v, op, w)
	}
	return r, nil
}

// UnknownParamError is returned when an expression needs a hyper-parameter
// the checkpoint and the config do not give.
type UnknownParamError struct{ Name string }

func (e *UnknownParamError) Error() string { return fmt.Sprintf("%s is not known", e.Name) }
