// The packed instruction store of a Trace: one fixed-size record per
// instruction, the variable parts (arguments, outputs, mutated indices) in
// three shared arrays, op names interned. A RELEASE takes 40 bytes instead
// of the 128 of an Instr, a CALL 40 plus 4 per argument and 16 per output,
// and nothing is allocated per instruction (issue 32: a 5-million-op trace
// held 8 GB).

package recompute

import (
	"fmt"
	"iter"
	"math"
)

// instrRec is one packed instruction. Its arguments are
// Trace.args[args:next.args] where next is the following record (or the
// end of the array for the last one), and likewise for outs and muts.
type instrRec struct {
	val  int64 // Size of a CONSTANT, Time of a CALL or MUTATE
	line int32 // saturated at math.MaxInt32
	t    int32
	old  int32
	op   int32 // index into Trace.ops; 0 is ""
	args uint32
	outs uint32
	muts uint32
	kind Kind
}

// maxPacked bounds the entries of each of a trace's arrays (records,
// arguments, outputs, mutated indices) so that their offsets fit the
// records' 32 bits.
const maxPacked = math.MaxUint32

// ErrTraceTooLarge is returned (wrapped) when a trace has more than
// 2^32-1 instructions, arguments or outputs.
var ErrTraceTooLarge = fmt.Errorf("trace too large (more than %d instructions, arguments or outputs)", uint64(maxPacked))

// Len returns the number of instructions.
func (t *Trace) Len() int { return len(t.recs) }

// At returns instruction i. Its Args, Outs and Mutated share the trace's
// arrays: read them, never write them (nil when empty).
func (t *Trace) At(i int) Instr {
	r := &t.recs[i]
	in := Instr{Kind: r.kind, Line: int(r.line), Op: t.ops[r.op], T: r.t, Old: r.old}
	switch r.kind {
	case KindConstant:
		in.Size = uint64(r.val)
	case KindCall, KindMutate:
		in.Time = r.val
	}
	a1, o1, m1 := uint32(len(t.args)), uint32(len(t.outs)), uint32(len(t.muts))
	if i+1 < len(t.recs) {
		n := &t.recs[i+1]
		a1, o1, m1 = n.args, n.outs, n.muts
	}
	if r.args < a1 {
		in.Args = t.args[r.args:a1:a1]
	}
	if r.outs < o1 {
		in.Outs = t.outs[r.outs:o1:o1]
	}
	if r.muts < m1 {
		in.Mutated = t.muts[r.muts:m1:m1]
	}
	return in
}

// All iterates over the instructions in order (as At returns them).
func (t *Trace) All() iter.Seq2[int, Instr] {
	return func(yield func(int, Instr) bool) {
		for i := range t.recs {
			if !yield(i, t.At(i)) {
				return
			}
		}
	}
}

// Instructions returns a copy of every instruction (for tests and small
// traces: it takes the 128 bytes an Instr takes per instruction).
func (t *Trace) Instructions() []Instr {
	out := make([]Instr, len(t.recs))
	for i := range out {
		out[i] = t.At(i)
	}
	return out
}

// Append adds an instruction at the end, copying its Args, Outs and
// Mutated. Only the fields its kind uses are kept: Size for CONSTANT, Time
// for CALL and MUTATE; a Line above math.MaxInt32 is kept as math.MaxInt32.
// It fails with ErrTraceTooLarge when an array would pass 2^32-1 entries.
func (t *Trace) Append(in Instr) error {
	if len(t.recs) >= maxPacked || len(t.args)+len(in.Args) > maxPacked ||
		len(t.outs)+len(in.Outs) > maxPacked || len(t.muts)+len(in.Mutated) > maxPacked {
		return ErrTraceTooLarge
	}
	r := instrRec{kind: in.Kind, line: int32(min(max(in.Line, 0), math.MaxInt32)), t: in.T, old: in.Old,
		op: t.intern(in.Op), args: uint32(len(t.args)), outs: uint32(len(t.outs)), muts: uint32(len(t.muts))}
	switch in.Kind {
	case KindConstant:
		r.val = int64(in.Size)
	case KindCall, KindMutate:
		r.val = in.Time
	}
	t.recs = append(t.recs, r)
	t.args = append(t.args, in.Args...)
	t.outs = append(t.outs, in.Outs...)
	t.muts = append(t.muts, in.Mutated...)
	return nil
}

// intern returns the index of name in t.ops, adding it if new.
func (t *Trace) intern(name string) int32 {
	if t.opIndex == nil {
		if len(t.ops) == 0 {
			t.ops = []string{""}
		}
		t.opIndex = make(map[string]int32, len(t.ops))
		for i, s := range t.ops {
			t.opIndex[s] = int32(i)
		}
	}
	if i, ok := t.opIndex[name]; ok {
		return i
	}
	i := int32(len(t.ops))
	t.ops = append(t.ops, name)
	t.opIndex[name] = i
	return i
}

// clip returns a copy of the trace's header sharing its arrays, with
// every array's capacity cut to its length, so that appending to either
// never writes into what the other reads.
func (t *Trace) clip() *Trace {
	c := *t
	c.recs = t.recs[:len(t.recs):len(t.recs)]
	c.args = t.args[:len(t.args):len(t.args)]
	c.outs = t.outs[:len(t.outs):len(t.outs)]
	c.muts = t.muts[:len(t.muts):len(t.muts)]
	c.ops = t.ops[:len(t.ops):len(t.ops)]
	c.opIndex = nil // rebuilt by intern if c is appended to
	return &c
}

// compact trims the arrays' spare capacity (after parsing: append leaves
// up to a quarter of a large array unused).
func (t *Trace) compact() {
	t.recs = trim(t.recs)
	t.args = trim(t.args)
	t.outs = trim(t.outs)
	t.muts = trim(t.muts)
}

func trim[T any](s []T) []T {
	if cap(s)-len(s) <= len(s)/16 {
		return s
	}
	return append(make([]T, 0, len(s)), s...)
}
