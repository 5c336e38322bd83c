package recompute

import "fmt"

// KindPin is a lowered instruction with no DTR trace-format line: tensor T
// stays resident from here on (a gradient the program keeps). The parser
// never produces it; a Builder records it when a running engine is told to
// pin a tensor it computed, so that a replay of the recording keeps the same
// bytes out of reach.
const KindPin Kind = KindAnnotate + 1

// Builder assembles a Trace instruction by instruction, the way a program
// runs: it is how an engine records the step it is executing (so that the
// step can be replayed under other policies, see package autotune). Tensors
// are numbered 0, 1, 2, ... in order of creation; every method returns or
// takes those numbers, and a method given a number the builder never
// returned, or a tensor with no reference left, fails and records nothing.
// The zero value is ready to use.
type Builder struct {
	tr   Trace    // the instructions recorded
	refs []int32  // tensor -> references held by the program
	size []uint64 // tensor -> size of the storage it lives in
}

func (b *Builder) check(what string, t int32) error {
	if t < 0 || int(t) >= len(b.refs) {
		return fmt.Errorf("trace builder: %s: unknown tensor %d (%d recorded)", what, t, len(b.refs))
	}
	if b.refs[t] <= 0 {
		return fmt.Errorf("trace builder: %s: tensor %d has no references left", what, t)
	}
	return nil
}

func (b *Builder) newTensor(size uint64) int32 {
	t := int32(len(b.refs))
	b.refs = append(b.refs, 1)
	b.size = append(b.size, size)
	return t
}

func (b *Builder) add(in Instr) {
	in.Line = b.tr.Len() + 1
	if err := b.tr.Append(in); err != nil {
		// 2^32-1 instructions, arguments or outputs: far beyond what
		// anything records (the engine's recorder stops at
		// evict.MaxRecordedInstructions, 2^20)
		panic(fmt.Sprintf("trace builder: %v", err))
	}
}

// Len returns the number of instructions recorded so far.
func (b *Builder) Len() int { return b.tr.Len() }

// Constant records an external tensor of size bytes (CONSTANT) and returns
// its number.
func (b *Builder) Constant(size uint64) int32 {
	t := b.newTensor(size)
	b.add(Instr{Kind: KindConstant, T: t, Size: size})
	return t
}

// Call records an op (CALL) that read args, took time nanoseconds and
// produced outs, and returns the new tensor numbers in order. An alias
// output lives in the storage of the argument it names (its Size is
// ignored). args is copied.
func (b *Builder) Call(op string, args []int32, outs []OutSpec, time int64) ([]int32, error) {
	for _, a := range args {
		if err := b.check("call "+op, a); err != nil {
			return nil, err
		}
	}
	for i, o := range outs {
		if o.Alias >= int32(len(args)) || o.Alias < -1 {
			return nil, fmt.Errorf("trace builder: call %s: output %d aliases argument %d of %d", op, i, o.Alias, len(args))
		}
	}
	in := Instr{Kind: KindCall, Op: op, Args: append([]int32(nil), args...), Outs: make([]Out, len(outs)), Time: time}
	ids := make([]int32, len(outs))
	for i, o := range outs {
		if o.Alias >= 0 {
			ids[i] = b.newTensor(b.size[args[o.Alias]])
			in.Outs[i] = Out{T: ids[i], Alias: o.Alias}
		} else {
			ids[i] = b.newTensor(o.Size)
			in.Outs[i] = Out{T: ids[i], Size: o.Size, Alias: -1}
		}
	}
	b.add(in)
	return ids, nil
}

// Mutate records an in-place op (MUTATE) that read args and overwrote the
// ones at the indices mutated: each gets a new version (returned in order),
// and the old version loses a reference. args is copied.
func (b *Builder) Mutate(op string, args []int32, mutated []int, time int64) ([]int32, error) {
	for _, a := range args {
		if err := b.check("mutate "+op, a); err != nil {
			return nil, err
		}
	}
	in := Instr{Kind: KindMutate, Op: op, Args: append([]int32(nil), args...), Outs: make([]Out, len(mutated)),
		Mutated: make([]int32, len(mutated)), Time: time}
	for i, m := range mutated {
		if m < 0 || m >= len(args) {
			return nil, fmt.Errorf("trace builder: mutate %s: mutated index %d out of range (%d args)", op, m, len(args))
		}
		in.Mutated[i] = int32(m)
	}
	ids := make([]int32, len(mutated))
	for i, m := range mutated {
		size := b.size[args[m]]
		ids[i] = b.newTensor(size)
		in.Outs[i] = Out{T: ids[i], Size: size, Alias: -1}
	}
	for _, m := range mutated {
		b.refs[args[m]]--
	}
	b.add(in)
	return ids, nil
}

// Copy records one more reference to t (COPY).
func (b *Builder) Copy(t int32) error {
	if err := b.check("copy", t); err != nil {
		return err
	}
	b.refs[t]++
	b.add(Instr{Kind: KindCopy, T: t})
	return nil
}

// Release records that the program dropped one reference to t (RELEASE).
func (b *Builder) Release(t int32) error {
	if err := b.check("release", t); err != nil {
		return err
	}
	b.refs[t]--
	b.add(Instr{Kind: KindRelease, T: t})
	return nil
}

// Pin records that t stays resident from here on (KindPin).
func (b *Builder) Pin(t int32) error {
	if err := b.check("pin", t); err != nil {
		return err
	}
	b.add(Instr{Kind: KindPin, T: t})
	return nil
}

// Trace returns the recording so far: its instructions, tensor names t0,
// t1, ..., and as outputs the tensors still referenced, in order of
// creation. The builder can go on recording without changing the returned
// trace (recorded instructions are never modified, so they are shared).
func (b *Builder) Trace() *Trace {
	tr := b.tr.clip()
	tr.Names = make([]string, len(b.refs))
	tr.Lines = b.tr.Len()
	for t, n := range b.refs {
		tr.Names[t] = fmt.Sprintf("t%d", t)
		if n > 0 {
			tr.Outputs = append(tr.Outputs, int32(t))
		}
	}
	return tr
}
