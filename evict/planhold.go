package evict

import (
	"fmt"

	rc "github.com/memscale/memscale/recompute"
)

// planHold is a rematerialization plan committed by HoldPlan whose steps are
// not all reported yet. It holds what its unreported re-run steps read, in
// two strengths:
//
//   - a hard hold (a lock) on the inputs of exactly one re-run step, the
//     first one not reported yet (the one about to run). A plan that
//     locked the inputs of all its steps at once would keep every rebuilt
//     intermediate, and every resident input of a late step, in memory
//     until the end of the plan: O(plan length) storages, where DTR needs
//     only the inputs of the op that is running.
//   - a soft hold on the inputs of every re-run step not reported yet, the
//     held one included (softHolds). A storage with a soft hold is a
//     reserve candidate: the budget loop takes it only when no ordinary
//     candidate is left (pick), so the plan's rebuilt intermediates and the
//     resident inputs of its later steps are not taken as cheap or stale
//     victims while the plan runs, which would make each of those steps
//     rebuild its input with a nested plan first.
type planHold struct {
	steps []rc.Step
	next  int    // first step not reported yet
	held  int    // index of the re-run step whose inputs are locked (-1: none)
	seq   uint32 // softHolds.seq when it was held: inner plans have larger ones
	// at[k] is the index in nextRead of the first input of step k (re-run
	// steps from the first one on have reads; at[len(steps)] is the total).
	at []int32
	// nextRead[at[k]+i] is the next re-run step of this plan after k that
	// reads the storage of input i of step k (-1: none; k itself for an
	// input that step k reads more than once, at all but its first read).
	nextRead []int32
}

// softHolds are the soft plan holds: per storage, how many reads of it the
// unreported re-run steps of the open plans make (count), and when it is
// read next. The open plans nest (an inner plan rebuilds an input of its
// outer plan's held step, and runs to the end first), so a storage is read
// next by the innermost plan that reads it, at that plan's first
// unreported step that does: each storage has a stack of entries, one per
// open plan that reads it, innermost on top, each with that plan's first
// unreported step reading it. Everything is updated incrementally, in
// O(the reads involved): HoldPlan pushes, a step report advances or pops
// the entries of the step's inputs, AbandonPlans pops. Nothing is
// allocated or scanned on an op while no plan is open.
type softHolds struct {
	count []int32   // per storage: reads by unreported re-run steps of open plans
	top   []int32   // per storage: 1 + index in uses of its top entry (0: none)
	uses  []softUse // the entries; free ones are chained through below
	free  int32     // 1 + index of the first free entry (0: none)
	first []int32   // HoldPlan's scratch, per storage: 1 + its first reading step (0: none)
	seq   uint32    // plans held so far (after 2^32 of them, due misorders)
}

// softUse is one entry of a storage's stack: a plan that reads it and the
// first step of the plan, not reported yet, that does.
type softUse struct {
	seq   uint32 // the plan's planHold.seq
	step  int32  // the plan's first unreported re-run step reading the storage
	below int32  // 1 + index of the entry of the next outer plan (0: none)
}

// softHeld reports whether s has a soft hold: a re-run step of an open plan,
// not reported yet, reads it (a reserve candidate when it is a candidate).
func (e *Engine) softHeld(s rc.StorageID) bool {
	return int(s) < len(e.soft.count) && e.soft.count[s] > 0
}

// due returns when soft-held s is read next, as a number that is smaller
// the later the read: reads by outer plans come after every read by inner
// ones, and within a plan later steps come later. Among reserve candidates
// the one with the smallest due goes first (Belady's rule: the one needed
// last). s must be softHeld.
func (e *Engine) due(s rc.StorageID) int64 {
	u := e.soft.uses[e.soft.top[s]-1]
	return int64(u.seq)<<31 - int64(u.step)
}

// HoldPlan commits a plan from Plan that the caller is about to run, steps in
// order. The engine then locks the inputs of the first re-run step not
// reported yet (the one about to run), marking them accessed: when
// Rematerialized reports that step, the next re-run step's inputs are
// locked and then that step's are unlocked. Swap-in steps (reported by
// SwappedIn) hold nothing of their own; the re-run step they feed holds the
// storages they bring back. So an eviction while the plan runs never takes
// the inputs of the step that runs next. The inputs of the later re-run
// steps (resident when the plan was made, or outputs of earlier steps once
// they are produced) are soft-held until the last step that reads them is
// reported: reserve candidates, which an eviction takes only when no
// ordinary candidate is left, the one read last first. Before it runs a
// step, the caller checks that its inputs are resident and rebuilds any
// that are not with a plan of its own (DTR's recursive rematerialization;
// the outer step's lock keeps each input once it is back). Plans may nest
// that way: a report matches the innermost plan whose held step it is.
func (e *Engine) HoldPlan(steps []rc.Step) error {
	first := -1
	for i, st := range steps {
		switch st.Kind {
		case rc.StepRerun:
			if err := e.g.CheckOp(st.Op); err != nil {
				return fmt.Errorf("evict: hold plan: step %d: %w", i, err)
			}
			if first < 0 {
				first = i
			}
		case rc.StepSwapIn:
			if err := e.g.CheckTensor(st.Tensor); err != nil {
				return fmt.Errorf("evict: hold plan: step %d: %w", i, err)
			}
		default:
			return fmt.Errorf("evict: hold plan: step %d: unknown kind %d", i, st.Kind)
		}
	}
	if first < 0 {
		return nil // swap-ins only: nothing to hold
	}
	n := len(e.plans)
	if n < cap(e.plans) {
		e.plans = e.plans[:n+1]
	} else {
		e.plans = append(e.plans, planHold{})
	}
	p := &e.plans[n]
	p.steps = append(p.steps[:0], steps...)
	p.next, p.held = 0, -1
	p.seq = e.soft.seq
	e.soft.seq++
	e.softHold(p, first)
	e.holdStep(p, first)
	return nil
}

// holdStep locks the inputs of re-run step i of p and marks them accessed.
func (e *Engine) holdStep(p *planHold, i int) {
	p.held = i
	for _, in := range e.g.Op(p.steps[i].Op).Inputs {
		s := e.g.Tensor(in).Storage
		st := e.g.Storage(s)
		st.Locks++
		st.LastAccess = e.clock
		e.sel.remove(s)
	}
}

// softHold adds the soft holds of new plan p, whose first re-run step is
// first: one count per read, and one entry per storage it reads, on top of
// the storage's stack, with the first step that reads it; it fills
// p.at and p.nextRead. A candidate that becomes a reserve one, or is read
// sooner, sorts later than before, which the candidate index may learn
// lazily (its stored key understates the true one; pick corrects it).
func (e *Engine) softHold(p *planHold, first int) {
	h := &e.soft
	p.at = p.at[:0]
	var reads int32
	for k, st := range p.steps {
		p.at = append(p.at, reads)
		if k >= first && st.Kind == rc.StepRerun {
			reads += int32(len(e.g.Op(st.Op).Inputs))
		}
	}
	p.at = append(p.at, reads)
	if int(reads) > cap(p.nextRead) {
		p.nextRead = make([]int32, reads)
	}
	p.nextRead = p.nextRead[:reads]
	// Last step first: h.first[s] ends as 1 + the first step reading s.
	for k := len(p.steps) - 1; k >= first; k-- {
		if p.steps[k].Kind != rc.StepRerun {
			continue
		}
		for i, in := range e.g.Op(p.steps[k].Op).Inputs {
			s := e.g.Tensor(in).Storage
			if int(s) >= len(h.count) {
				grow := int(s) + 1 - len(h.count)
				h.count = append(h.count, make([]int32, grow)...)
				h.top = append(h.top, make([]int32, grow)...)
				h.first = append(h.first, make([]int32, grow)...)
			}
			h.count[s]++
			p.nextRead[int(p.at[k])+i] = h.first[s] - 1
			h.first[s] = int32(k) + 1
		}
	}
	for k := first; k < len(p.steps); k++ {
		if p.steps[k].Kind != rc.StepRerun {
			continue
		}
		for _, in := range e.g.Op(p.steps[k].Op).Inputs {
			s := e.g.Tensor(in).Storage
			if f := h.first[s]; f > 0 {
				h.push(s, p.seq, f-1)
				h.first[s] = 0
			}
		}
	}
}

// push puts the entry of plan seq, first reading s at step, on top of s's
// stack.
func (h *softHolds) push(s rc.StorageID, seq uint32, step int32) {
	u := softUse{seq: seq, step: step, below: h.top[s]}
	if h.free > 0 {
		i := h.free - 1
		h.free = h.uses[i].below
		h.uses[i] = u
		h.top[s] = i + 1
		return
	}
	h.uses = append(h.uses, u)
	h.top[s] = int32(len(h.uses))
}

// advance moves the entry of plan seq in s's stack to its next reading step
// (next >= 0) or takes it out and frees it (next < 0).
func (h *softHolds) advance(s rc.StorageID, seq uint32, next int32) {
	link := &h.top[s]
	for *link != 0 {
		i := *link - 1
		u := &h.uses[i]
		if u.seq != seq {
			link = &u.below
			continue
		}
		if next >= 0 {
			u.step = next
			return
		}
		*link = u.below
		u.below = h.free
		h.free = i + 1
		return
	}
}

// softRelease takes away the soft holds of re-run step k of p, reported or
// abandoned: one count per read, and each input's entry for p moves to the
// next step of p that reads it, or goes. A storage read later now (or not
// any more: an ordinary candidate again) sorts earlier, which the index is
// told (lowered); with Config.Stress one left with no soft hold is queued
// for stressEvict, which skipped it while it was held.
func (e *Engine) softRelease(p *planHold, k int) {
	h := &e.soft
	ins := e.g.Op(p.steps[k].Op).Inputs
	for _, in := range ins {
		h.count[e.g.Tensor(in).Storage]--
	}
	for i, in := range ins {
		s := e.g.Tensor(in).Storage
		next := p.nextRead[int(p.at[k])+i]
		if int(next) == k {
			continue // step k reads s more than once: the first read moved it
		}
		h.advance(s, p.seq, next)
		e.sel.lowered(s)
		if h.count[s] == 0 && e.cfg.Stress && e.eligible(e.g.Storage(s)) {
			e.stressNote(s)
		}
	}
}

// planStepDone advances the innermost plan that step st (a re-run or a
// swap-in just reported) belongs to: for a re-run, the plan whose held step
// runs st.Op; for a swap-in, one with that swap-in among its steps before
// the held one. The inputs of the plan's next re-run step are locked before
// those of the step that ran lose their soft holds and are unlocked (an
// input both read stays locked throughout). A finished plan is forgotten.
// A report that matches no plan changes nothing.
func (e *Engine) planStepDone(st rc.Step) error {
	for i := len(e.plans) - 1; i >= 0; i-- {
		p := &e.plans[i]
		j := -1
		switch st.Kind {
		case rc.StepRerun:
			if p.held >= 0 && p.steps[p.held].Op == st.Op {
				j = p.held
			}
		case rc.StepSwapIn:
			for k := p.next; k < p.held; k++ {
				if s := p.steps[k]; s.Kind == rc.StepSwapIn && s.Tensor == st.Tensor {
					j = k
					break
				}
			}
		}
		if j < 0 {
			continue
		}
		p.next = j + 1
		if j != p.held {
			return nil
		}
		ran := p.steps[j].Op
		p.held = -1
		for k := p.next; k < len(p.steps); k++ {
			if p.steps[k].Kind == rc.StepRerun {
				e.holdStep(p, k)
				break
			}
		}
		e.softRelease(p, j)
		if p.held < 0 {
			// Done (trailing swap-ins lock nothing): forget the plan.
			e.forgetPlan(i)
		}
		return e.unlockStep(ran)
	}
	return nil
}

// unlockStep takes away a plan's lock on the inputs of re-run step op.
func (e *Engine) unlockStep(op rc.OpID) error {
	for _, in := range e.g.Op(op).Inputs {
		if err := e.unlockStorage(e.g.Tensor(in).Storage); err != nil {
			return fmt.Errorf("releasing the plan's hold on the inputs of op %d: %w", op, err)
		}
	}
	return nil
}

// forgetPlan removes plans[i], keeping the buffers of the last slot for
// reuse.
func (e *Engine) forgetPlan(i int) {
	last := len(e.plans) - 1
	done := e.plans[i]
	copy(e.plans[i:], e.plans[i+1:])
	e.plans[last] = done
	e.plans = e.plans[:last]
}

// AbandonPlans forgets every open plan, innermost first, for a caller that
// gives up running them (a step failed and the error goes to the program):
// each plan's lock on the inputs of its held step and its soft holds on the
// inputs of its unreported re-run steps are taken away, as if those steps
// had been reported, and no later report matches the plans. Nothing is
// evicted or rebuilt. Without it the holds of a plan stay until its last
// re-run step is reported or the engine is dropped.
func (e *Engine) AbandonPlans() error {
	for len(e.plans) > 0 {
		i := len(e.plans) - 1
		p := &e.plans[i]
		held := p.held
		for k := held; k < len(p.steps); k++ {
			if p.steps[k].Kind == rc.StepRerun {
				e.softRelease(p, k)
			}
		}
		op := p.steps[held].Op
		e.forgetPlan(i)
		if err := e.unlockStep(op); err != nil {
			return fmt.Errorf("evict: abandon plans: %w", err)
		}
	}
	return nil
}

// PlanHolds returns the number of committed plans that still hold the inputs
// of a step (plans not run to the end).
func (e *Engine) PlanHolds() int { return len(e.plans) }
