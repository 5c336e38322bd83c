// The program's operations: external tensors, ops, in-place ops and reads.
// See doc.go for the design.

package evict

import (
	"fmt"

	"github.com/memscale/memscale/internal/satmath"
	rc "github.com/memscale/memscale/recompute"
)

// AddTensor registers an external tensor (an input or parameter) of nbytes,
// resident, holding one reference. A pinned tensor is never evicted; an
// unpinned one can only be swapped (it has no lineage to recompute it from).
// A size above rc.MaxSize, or one that would take the engine's live storages
// above rc.MaxLiveBytes, is an error wrapping rc.ErrTooLarge, and nothing is
// registered.
func (e *Engine) AddTensor(nbytes uint64, pinned bool) (rc.TensorID, error) {
	t, err := e.g.AddExternal(nbytes, e.clock)
	if err != nil {
		return 0, fmt.Errorf("evict: tensor: %w", err)
	}
	s := e.g.Tensor(t).Storage
	if pinned {
		e.g.Storage(s).Pins++
		e.setFlag(s, flagRegPin, true)
	}
	e.countPinned(s, e.g.Storage(s))
	e.grow(nbytes)
	e.refresh(s)
	e.recConstant(t, nbytes)
	return t, nil
}

// NewTensor is AddTensor for a size the caller knows to be valid (tests,
// programs built in code); it panics where AddTensor fails. Callers that
// pass sizes from outside (the C ABI, a trace) use AddTensor.
func (e *Engine) NewTensor(nbytes uint64, pinned bool) rc.TensorID {
	t, err := e.AddTensor(nbytes, pinned)
	if err != nil {
		panic(err)
	}
	return t
}

// Output describes one output of an op for Call.
type Output = rc.OutSpec

// Call records that an op ran: it read inputs (all resident), took cost
// nanoseconds, and produced outputs (fresh storage or views of an input). The
// outputs are resident, hold one reference each, count as accessed at the
// clock after the op, and are returned in order. Reads of the inputs are
// reported with Access (the C ABI does it for every input before Call).
func (e *Engine) Call(name string, inputs []rc.TensorID, outs []Output, cost int64, flags rc.OpFlags) (rc.OpID, []rc.TensorID, error) {
	op, ids, err := e.call(name, inputs, outs, cost, flags)
	if err == nil {
		e.noteFloor(name, inputs, ids)
		e.recCall(name, inputs, outs, cost, ids)
	}
	return op, ids, err
}

func (e *Engine) call(name string, inputs []rc.TensorID, outs []Output, cost int64, flags rc.OpFlags) (rc.OpID, []rc.TensorID, error) {
	op, err := e.g.AddOp(name, inputs, outs, cost, flags, satmath.AddInt64(e.clock, cost))
	if err != nil {
		return 0, nil, fmt.Errorf("evict: call: %w", err)
	}
	e.tick(&e.stats.BaseCostNS, cost)
	o := e.g.Op(op)
	var fresh uint64
	for _, out := range o.Outputs {
		x := e.g.Tensor(out)
		s := e.g.Storage(x.Storage)
		s.LastAccess = e.clock
		if x.Alias < 0 {
			fresh += s.Size
			e.countPinned(x.Storage, s)
		}
	}
	e.grow(fresh)
	e.tr.added(op)
	// The simulator appends new candidates siblings first, then the first
	// output; keep that order (it breaks ties).
	for i := 1; i <= len(o.Outputs); i++ {
		e.refresh(e.g.Tensor(o.Outputs[i%len(o.Outputs)]).Storage)
	}
	return op, o.Outputs, nil
}

// Mutate records an in-place op: it read inputs and overwrote the ones at
// the mutated indices. Each mutated input gets a new version (returned in
// order) that takes over its memory and its pins; the old version's value is
// gone, so its storage counts as evicted without being freed (it is rebuilt
// by recomputation if anything needs it, or is lost if it cannot be
// recomputed), and it loses one reference as the new version gains one.
func (e *Engine) Mutate(name string, inputs []rc.TensorID, mutated []int, cost int64, flags rc.OpFlags) (rc.OpID, []rc.TensorID, error) {
	outs := make([]Output, len(mutated))
	for i, m := range mutated {
		if m < 0 || m >= len(inputs) {
			return 0, nil, fmt.Errorf("evict: mutate %s: mutated index %d out of range (%d inputs)", name, m, len(inputs))
		}
		for _, p := range mutated[:i] {
			if p == m {
				return 0, nil, fmt.Errorf("evict: mutate %s: mutated index %d listed twice", name, m)
			}
		}
		if err := e.g.CheckTensor(inputs[m]); err != nil {
			return 0, nil, fmt.Errorf("evict: mutate %s: %w", name, err)
		}
		outs[i] = Output{Size: e.g.StorageOf(inputs[m]).Size, Alias: -1}
	}
	peak := e.peak
	op, ids, err := e.call(name, inputs, outs, cost, flags)
	if err != nil {
		return 0, nil, err
	}
	e.recMutate(name, inputs, mutated, cost, ids)
	// The new versions live in the inputs' memory: the op needed its
	// inputs resident, and the pins as they were (the new versions, which
	// Call counted if small, count from when they take over).
	for _, id := range ids {
		nw := e.g.Tensor(id).Storage
		e.uncountPinned(nw, e.g.Storage(nw))
	}
	e.noteFloor(name, inputs, nil)
	for i, m := range mutated {
		old := e.g.Tensor(inputs[m]).Storage
		nw := e.g.Tensor(ids[i]).Storage
		os, ns := e.g.Storage(old), e.g.Storage(nw)
		e.uncountPinned(old, os)
		reg := os.Pins > 0 && e.flag(old, flagRegPin)
		ns.Pins, os.Pins = ns.Pins+os.Pins, 0
		e.setFlag(nw, flagRegPin, reg)
		e.countPinned(old, os) // unpinned now: counted as any storage until dropped
		e.countPinned(nw, ns)
		// The new version lives in the old memory: dropping the old
		// storage gives back the bytes Call counted for the new one. The
		// old value is recomputed if something needs it; if it cannot be
		// (NoRecompute), planning for it fails and says so.
		if os.State == rc.Resident {
			e.dropStorage(old)
		} else {
			// an earlier mutated input shared the storage and dropped
			// it already; this version reuses the same memory too
			e.usage -= ns.Size
		}
		e.refresh(nw)
	}
	e.peak = max(peak, e.usage)
	for _, m := range mutated {
		if err := e.release(inputs[m]); err != nil {
			return 0, nil, fmt.Errorf("evict: mutate %s: %w", name, err)
		}
	}
	return op, ids, nil
}

// dropStorage marks s evicted (no victim is queued).
func (e *Engine) dropStorage(s rc.StorageID) {
	st := e.g.Storage(s)
	e.uncountPinned(s, st)
	e.g.Drop(s)
	e.usage -= st.Size
	e.sel.remove(s)
	e.tr.dropped(s)
}

// Access records that tensor t was read now (the staleness clock).
func (e *Engine) Access(t rc.TensorID) error {
	if _, err := e.tensor(t); err != nil {
		return fmt.Errorf("evict: access: %w", err)
	}
	e.g.StorageOf(t).LastAccess = e.clock
	return nil
}
