package pickle

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math/big"
)

// Dict keys.
//
// A pickle can share one tuple through the memo many times over, and tuples
// of such tuples: ten levels of ten references each is a tuple of 10^10
// leaves written in 250 bytes. A key that expands the structure (a string of
// its whole contents, or a plain recursive hash) costs time and memory
// exponential in the input. So a tuple key is hashed to 64 bits with a memo by
// tuple identity, which makes a shared tuple cost one visit, and a hash match
// is confirmed by a structural comparison that remembers the pairs of tuples
// it has proven equal. Both are linear in the number of distinct tuples in the
// key.

// keySeed makes tuple hashes unpredictable, so that no input can be built to
// put every key in one bucket.
var keySeed = maphash.MakeSeed()

// maxKeyDepth bounds recursion through nested tuples when hashing a key. The
// decoder's own depth limit is normally lower.
const maxKeyDepth = 1000

// Normalized forms of non-tuple keys, for values that are not themselves
// comparable or whose Go equality differs from Python's.
type (
	noneKey  struct{}
	bytesKey string
	bigKey   string
)

// tupleHash is the hash of a tuple key.
type tupleHash uint64

// scalarKey returns the comparable form of a hashable value other than a
// tuple, equal for values Python considers equal (True == 1 == 1.0).
func scalarKey(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return noneKey{}, nil
	case bool:
		if x {
			return int64(1), nil
		}
		return int64(0), nil
	case int64, string, Global, *Object:
		return x, nil
	case float64:
		if x == float64(int64(x)) {
			return int64(x), nil
		}
		return x, nil
	case []byte:
		return bytesKey(x), nil
	case *big.Int:
		return bigKey(x.String()), nil
	case *Set:
		if x.Frozen {
			return x, nil
		}
		return nil, fmt.Errorf("pickle: unhashable key type set")
	default:
		return nil, fmt.Errorf("pickle: unhashable key type %s", typeName(v))
	}
}

// tupleID is a tuple's identity: tuples shared through the memo are one Go
// slice. Empty tuples have none and need none.
type tupleID struct {
	first *any
	n     int
}

func idOf(t Tuple) tupleID { return tupleID{&t[0], len(t)} }

// hashTuple hashes a tuple key, visiting each distinct tuple once.
func hashTuple(t Tuple) (tupleHash, error) {
	h := tupleHasher{}
	return h.hash(t, 0)
}

type tupleHasher struct {
	seen map[tupleID]tupleHash // nested tuples already hashed
}

func (h *tupleHasher) hash(t Tuple, depth int) (tupleHash, error) {
	if depth > maxKeyDepth {
		return 0, fmt.Errorf("%w: tuple key nested deeper than %d", ErrLimit, maxKeyDepth)
	}
	if len(t) == 0 {
		return tupleHash(maphash.Comparable(keySeed, "()")), nil
	}
	if v, ok := h.seen[idOf(t)]; ok {
		return v, nil
	}
	var mh maphash.Hash
	mh.SetSeed(keySeed)
	var buf [9]byte
	for _, e := range t {
		if et, ok := e.(Tuple); ok {
			eh, err := h.hash(et, depth+1)
			if err != nil {
				return 0, err
			}
			buf[0] = 't'
			binary.LittleEndian.PutUint64(buf[1:], uint64(eh))
		} else {
			k, err := scalarKey(e)
			if err != nil {
				return 0, err
			}
			buf[0] = 's'
			binary.LittleEndian.PutUint64(buf[1:], maphash.Comparable(keySeed, k))
		}
		mh.Write(buf[:])
	}
	v := tupleHash(mh.Sum64())
	if depth > 0 { // only nested tuples can be met again
		if h.seen == nil {
			h.seen = map[tupleID]tupleHash{}
		}
		h.seen[idOf(t)] = v
	}
	return v, nil
}

// tuplesEqual compares two hashable tuples as Python does. Shared tuples are
// equal by identity, and a pair proven equal once is not compared again, so a
// comparison costs at most one visit per distinct pair of tuples (any
// difference ends the whole comparison).
func tuplesEqual(a, b Tuple) bool {
	c := tupleComparer{}
	return c.equal(a, b)
}

type tupleComparer struct {
	proven map[[2]tupleID]bool
}

func (c *tupleComparer) equal(a, b Tuple) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || idOf(a) == idOf(b) {
		return true
	}
	pair := [2]tupleID{idOf(a), idOf(b)}
	if c.proven[pair] {
		return true
	}
	for i := range a {
		at, aok := a[i].(Tuple)
		bt, bok := b[i].(Tuple)
		switch {
		case aok != bok:
			return false
		case aok:
			if !c.equal(at, bt) {
				return false
			}
		default:
			ak, err1 := scalarKey(a[i])
			bk, err2 := scalarKey(b[i])
			if err1 != nil || err2 != nil || ak != bk {
				return false
			}
		}
	}
	if c.proven == nil {
		c.proven = map[[2]tupleID]bool{}
	}
	c.proven[pair] = true
	return true
}
