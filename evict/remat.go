// Rebuilding: plans, re-runs and swap-ins.
// See doc.go for the design.

package evict

import (
	"fmt"

	rc "github.com/memscale/memscale/recompute"
)

// Plan returns the steps that make t resident (empty when it is), evicted
// ancestors first, appended to buf. It changes nothing; HoldPlan commits it.
func (e *Engine) Plan(t rc.TensorID, buf []rc.Step) ([]rc.Step, error) {
	steps, err := e.g.Plan(t, buf)
	if err != nil {
		return buf, fmt.Errorf("evict: plan: %w", err)
	}
	return steps, nil
}

// Rematerialized records that op ran again, taking cost nanoseconds (a
// negative cost means the cost recorded when it first ran). Its inputs must be
// resident; all its outputs become resident, except an output whose storage
// was released for good (the program dropped it and nothing can need it):
// the re-run made a throw-away copy of it, which the next Evict hands out to
// be freed. If the op is the held step of a committed plan (HoldPlan), the
// plan moves on to its next step.
func (e *Engine) Rematerialized(op rc.OpID, cost int64) error {
	return e.RematerializedFor(op, -1, cost)
}

// RematerializedFor is Rematerialized for a re-run done to rebuild output
// target (-1 if none in particular): the other outputs become candidates
// first, then target, which is the order the simulator uses to break ties.
func (e *Engine) RematerializedFor(op rc.OpID, target rc.TensorID, cost int64) error {
	if err := e.g.CheckOp(op); err != nil {
		return fmt.Errorf("evict: rematerialized: %w", err)
	}
	o := e.g.Op(op)
	if cost < 0 {
		cost = o.Cost
	}
	newly, dup, err := e.g.Rerun(op, e.scratch[:0])
	if err != nil {
		return fmt.Errorf("evict: rematerialized: %w", err)
	}
	e.tick(&e.stats.RematCostNS, cost)
	e.stats.Rematerializations++
	var added uint64
	for _, s := range newly {
		added += e.g.Storage(s).Size
	}
	if e.usage+added+dup > e.peak {
		e.peak = e.usage + added + dup
	}
	e.usage += added
	for _, s := range newly {
		e.countPinned(s, e.g.Storage(s))
	}
	if len(newly) > 0 {
		e.unqueueResident()
	}
	e.markRebuilt(newly...)
	e.noteFloor(o.Name, o.Inputs, o.Outputs)
	e.tr.resident(newly)
	for _, s := range newly {
		e.notNeeded(s)
	}
	if len(o.Outputs) > 1 {
		// Throw-away copies of released outputs: the caller frees them.
		for _, out := range o.Outputs {
			x := e.g.Tensor(out)
			if st := e.g.Storage(x.Storage); x.Alias < 0 && st.State == rc.Released {
				e.queue(Victim{Tensor: st.Root, Action: Drop, Size: st.Size}, ReasonBanish)
			}
		}
	}
	var last rc.StorageID = -1
	if target >= 0 {
		last = e.g.Tensor(target).Storage
	}
	for _, s := range newly {
		if s != last {
			e.refresh(s)
		}
	}
	if last >= 0 {
		e.refresh(last)
	}
	e.scratch = newly[:0]
	if len(e.plans) > 0 {
		if err := e.planStepDone(rc.Step{Kind: rc.StepRerun, Op: op}); err != nil {
			return fmt.Errorf("evict: rematerialized: %w", err)
		}
	}
	return nil
}

// SwappedIn records that the swapped storage of t was copied back.
func (e *Engine) SwappedIn(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: swapped in: %w", err)
	}
	st := e.g.Storage(x.Storage)
	if st.State != rc.Swapped {
		return fmt.Errorf("evict: swapped in: storage of tensor %d is %s, not swapped", t, st.State)
	}
	e.g.SwapIn(x.Storage)
	e.unqueueResident()
	e.countPinned(x.Storage, st)
	e.markRebuilt(x.Storage)
	e.grow(st.Size)
	e.stats.SwapsIn++
	e.tick(&e.stats.SwapCostNS, e.transferNS(st.Size))
	e.refresh(x.Storage)
	if len(e.plans) > 0 {
		if err := e.planStepDone(rc.Step{Kind: rc.StepSwapIn, Tensor: st.Root}); err != nil {
			return fmt.Errorf("evict: swapped in: %w", err)
		}
	}
	return nil
}

// unqueueResident takes out of the pending queue the storages that are
// resident again. A storage the engine freed on its own (an eager eviction at
// a release) waits in the queue until the caller hears of it with its next
// op or Evict; a plan made meanwhile rebuilds it (the caller, which has not
// freed it yet, keeps the data it holds), and handing it out after that
// would make the caller drop data the engine counts resident. It costs
// O(pending) and runs only when a storage comes back.
func (e *Engine) unqueueResident() {
	if e.pendAt == len(e.pending) {
		return
	}
	kept := e.pending[:e.pendAt]
	for _, v := range e.pending[e.pendAt:] {
		if e.g.Storage(e.g.Tensor(v.Tensor).Storage).State != rc.Resident {
			kept = append(kept, v)
		}
	}
	e.pending = kept
}
