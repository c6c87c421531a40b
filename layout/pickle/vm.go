package pickle

// The virtual machine: one opcode at a time (step), on the stack and memo
// of decode.go, every limit checked before anything is allocated.

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

func (d *decoder) run() (any, error) {
	for {
		if d.pos >= len(d.data) {
			d.op = 0
			return nil, &Error{Offset: d.pos, Msg: "truncated input: no STOP opcode"}
		}
		if d.pos >= d.releaseAt {
			d.releaseBehind()
		}
		d.opPos = d.pos
		d.op = d.data[d.pos]
		d.pos++
		if d.op == opSTOP {
			s, err := d.pop()
			if err != nil {
				return nil, err
			}
			if d.late && expandedSize(s.v, d.opts.MaxItems) > d.opts.MaxItems {
				return nil, d.limit("more than %d container items (memo references count as copies)", d.opts.MaxItems)
			}
			return s.v, nil
		}
		if err := d.step(); err != nil {
			return nil, err
		}
	}
}

// The VM tells Options.Release of the part behind it every releaseStep
// bytes, less the last releaseLag (a record read may step back a little).
const (
	releaseStep = 8 << 20
	releaseLag  = 1 << 20
)

func (d *decoder) releaseBehind() {
	if hi := d.pos - releaseLag; hi > d.released {
		d.opts.Release(d.released, hi)
		d.released = hi
	}
	d.releaseAt = d.pos + releaseStep
}

func (d *decoder) step() error {
	// An opcode's operands come first: its fixed-width argument (n), then
	// the stack entries it consumes (args, valid until the next push).
	shape := shapes[d.op]
	var n uint64
	var args []slot
	var err error
	switch {
	case shape.width == 1 && d.pos < len(d.data):
		// BINGET, BININT1, a short str's length...: most operands, read
		// without readUint's loop (which says where one is missing).
		n = uint64(d.data[d.pos])
		d.pos++
	case shape.width > 0:
		if n, err = d.readUint(int(shape.width)); err != nil {
			return err
		}
	}
	switch {
	case shape.pops == popsMark:
		args, err = d.popMark()
	case shape.pops > 0:
		args, err = d.popN(int(shape.pops))
	}
	if err != nil {
		return err
	}
	switch d.op {
	case opPROTO:
		if n > 5 {
			return d.fail("unsupported protocol %d", n)
		}
		return nil
	case opFRAME:
		return nil
	case opMARK:
		if len(d.stack)+len(d.marks) >= d.opts.MaxStack {
			return d.limit("stack deeper than %d entries", d.opts.MaxStack)
		}
		d.marks = append(d.marks, len(d.stack))
		return nil
	case opPOP:
		if len(d.stack) > d.base() {
			_, err := d.pop()
			return err
		}
		_, err := d.popMark()
		return err
	case opPOP_MARK:
		_, err := d.popMark()
		return err
	case opDUP:
		s, err := d.top()
		if err != nil {
			return err
		}
		s.shared = true
		return d.pushSlot(s)

	// Constants and scalars.
	case opNONE:
		return d.push(nil, 0)
	case opNEWTRUE:
		return d.push(true, 0)
	case opNEWFALSE:
		return d.push(false, 0)
	case opBININT1, opBININT2:
		return d.push(int64(n), 0) // boxing 0..255 allocates nothing
	case opBININT:
		return d.push(int64(int32(uint32(n))), 0)
	case opLONG1, opLONG4:
		if n > maxLongBytes {
			return d.limit("integer of %d bytes exceeds the limit of %d", n, maxLongBytes)
		}
		b, err := d.read(int(n))
		if err != nil {
			return err
		}
		return d.push(decodeLong(b), 0)
	case opBINFLOAT:
		b, err := d.read(8)
		if err != nil {
			return err
		}
		return d.push(math.Float64frombits(binary.BigEndian.Uint64(b)), 0)
	case opSHORT_BINUNICODE, opBINUNICODE, opBINUNICODE8:
		b, err := d.readCounted(n)
		if err != nil {
			return err
		}
		return d.push(d.str(b), 0)
	case opSHORT_BINBYTES, opBINBYTES, opBINBYTES8, opBYTEARRAY8:
		b, err := d.readCounted(n)
		if err != nil {
			return err
		}
		return d.push(append([]byte(nil), b...), 0)

	// Containers.
	case opEMPTY_TUPLE, opTUPLE1, opTUPLE2, opTUPLE3, opTUPLE:
		return d.pushTuple(args)
	case opEMPTY_LIST:
		return d.push(&List{node: newNode()}, 1)
	case opLIST:
		args = slices.Clone(args) // the push below overwrites them
		if err := d.push(&List{node: newNode()}, 1); err != nil {
			return err
		}
		return d.appendTo(args)
	case opAPPEND, opAPPENDS:
		return d.appendTo(args)
	case opEMPTY_DICT:
		return d.push(d.newDict(), 1)
	case opDICT:
		args = slices.Clone(args) // the push below overwrites them
		if err := d.push(d.newDict(), 1); err != nil {
			return err
		}
		return d.setItems(args)
	case opSETITEM, opSETITEMS:
		return d.setItems(args)
	case opEMPTY_SET:
		return d.push(&Set{node: newNode()}, 1)
	case opADDITEMS:
		t, err := d.top()
		if err != nil {
			return err
		}
		s, ok := t.v.(*Set)
		if !ok || s.Frozen {
			return d.fail("cannot add items to %s", typeName(t.v))
		}
		return d.addToSet(s, args)
	case opFROZENSET:
		s := &Set{Frozen: true, node: newNode()}
		if err := d.addToSet(s, args); err != nil {
			return err
		}
		return d.push(s, int(s.depth))

	// Memo.
	case opMEMOIZE:
		s, err := d.top()
		if err != nil {
			return err
		}
		return d.memoPut(uint32(d.memoLen()), s)
	case opBINPUT, opLONG_BINPUT:
		s, err := d.top()
		if err != nil {
			return err
		}
		return d.memoPut(uint32(n), s)
	case opBINGET, opLONG_BINGET:
		// A class got from the memo and called at once, as a pickler
		// writes every object but a class's first: a record, maybe; and
		// records come back to back (a list's items, a dict's keys and
		// values), each read here as the loop would read its BINGET.
		for d.rec != nil && len(d.data)-d.pos >= 2 && d.data[d.pos] == opEMPTY_TUPLE && d.data[d.pos+1] == opNEWOBJ {
			e, ok := d.refs.at(uint32(n))
			if !ok || !e.shared {
				break
			}
			if _, ok := e.v.(Global); !ok {
				break
			}
			d.pos += 2
			took, err := d.record(*e, slot{v: emptyTuple, d: 1, w: 1}, e)
			if err != nil {
				return err
			}
			if !took {
				d.pos -= 2
				d.rec.declined = d.pos + 1 // its NEWOBJ: not again
				break
			}
			if len(d.data)-d.pos < 2 || d.data[d.pos] != opBINGET {
				return nil
			}
			d.opPos, n = d.pos, uint64(d.data[d.pos+1])
			d.pos += 2
		}
		return d.memoGet(uint32(n))

	// Globals and objects.
	case opGLOBAL:
		start := d.pos
		module, err := d.readLine()
		if err != nil {
			return err
		}
		name, err := d.readLine()
		if err != nil {
			return err
		}
		key := d.data[start:d.pos]
		g := d.globals.get(key)
		if g == nil {
			g = Global{Module: string(module), Name: string(name)}
			d.globals.put(key, g)
		}
		return d.push(g, 0)
	case opSTACK_GLOBAL:
		module, ok1 := args[0].v.(string)
		name, ok2 := args[1].v.(string)
		if !ok1 || !ok2 {
			return d.fail("STACK_GLOBAL needs two strings, got %s and %s", typeName(args[0].v), typeName(args[1].v))
		}
		return d.push(Global{Module: module, Name: name}, 0)
	case opNEWOBJ:
		if d.rec != nil && d.opPos != d.rec.declined {
			if took, err := d.record(args[0], args[1], nil); took || err != nil {
				return err
			}
		}
		return d.newObject(args[0], args[1], nil)
	case opREDUCE:
		return d.newObject(args[0], args[1], nil)
	case opNEWOBJ_EX:
		return d.newObject(args[0], args[1], &args[2])
	case opBUILD:
		t, err := d.top()
		if err != nil {
			return err
		}
		obj, ok := t.v.(*Object)
		if !ok {
			return d.fail("BUILD on %s", typeName(t.v))
		}
		if err := d.put(&obj.node, args[0]); err != nil {
			return err
		}
		obj.State = args[0].v
		if d.opts.Sink != nil && !obj.placed {
			v, took, err := d.opts.Sink.Built(obj)
			if err != nil {
				return d.sinkErr(err)
			}
			if took {
				d.stack[len(d.stack)-1] = slot{v: v, d: 0, w: 1}
				release(obj)
			}
		}
		return nil
	case opBINPERSID:
		if d.opts.PersistentLoad == nil {
			return d.fail("persistent id without a persistent-load hook")
		}
		pid := args[0]
		v, err := d.opts.PersistentLoad(pid.v)
		if err != nil {
			return &Error{Offset: d.opPos, Op: opName(d.op), Msg: "persistent load: " + err.Error(), Err: err}
		}
		return d.pushSlot(slot{v: v, d: int32(pid.depth()), w: pid.weight()})
	}
	if name, ok := opNames[d.op]; ok {
		return &Error{Offset: d.opPos, Msg: fmt.Sprintf("unsupported opcode %s (0x%02x) at offset %d", name, d.op, d.opPos)}
	}
	return &Error{Offset: d.opPos, Msg: fmt.Sprintf("unknown opcode 0x%02x at offset %d", d.op, d.opPos)}
}

func (d *decoder) newDict() *Dict {
	dict := d.dicts.one()
	dict.node = newNode()
	return dict
}

func (d *decoder) newObject(callable, args slot, kwargs *slot) error {
	obj := d.objects.one()
	obj.NewObj, obj.node = d.op != opREDUCE, newNode()
	switch c := callable.v.(type) {
	case Global:
		obj.Class = c
	case *Object:
		if d.op != opREDUCE {
			return d.fail("%s on %s (needs a class)", opName(d.op), typeName(callable.v))
		}
		obj.extra().Func = c
		if err := d.put(&obj.node, callable); err != nil {
			return err
		}
	default:
		return d.fail("%s on %s (only globals and objects can be called)", opName(d.op), typeName(callable.v))
	}
	t, ok := args.v.(Tuple)
	if !ok {
		return d.fail("%s arguments must be a tuple, got %s", opName(d.op), typeName(args.v))
	}
	obj.Args = t
	if err := d.put(&obj.node, args); err != nil {
		return err
	}
	if kwargs != nil {
		kw, ok := kwargs.v.(*Dict)
		if !ok {
			return d.fail("NEWOBJ_EX keyword arguments must be a dict, got %s", typeName(kwargs.v))
		}
		if err := d.put(&obj.node, *kwargs); err != nil {
			return err
		}
		obj.extra().Kwargs = kw
	}
	return d.push(obj, int(obj.depth))
}
