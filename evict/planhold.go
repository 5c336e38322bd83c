package evict

import (
	"fmt"

	rc "github.com/memscale/memscale/recompute"
)

// planHold is a rematerialization plan committed by HoldPlan whose steps are
// not all reported yet. It keeps the inputs of exactly one re-run step locked:
// the first re-run step not reported yet (the one about to run). A plan that
// locked the inputs of all its steps at once would keep every rebuilt
// intermediate, and every resident input of a late step, in memory until the
// end of the plan: O(plan length) storages, where DTR needs only the inputs
// of the op that is running.
type planHold struct {
	steps []rc.Step
	next  int // first step not reported yet
	held  int // index of the re-run step whose inputs are locked (-1: none)
}

// HoldPlan commits a plan from Plan that the caller is about to run, steps in
// order. The engine then locks the inputs of the first re-run step not
// reported yet (the one about to run), marking them accessed, and nothing
// else: when Rematerialized reports that step, the next re-run step's inputs
// are locked and then that step's are unlocked. Swap-in steps (reported by
// SwappedIn) hold nothing of their own; the re-run step they feed holds the
// storages they bring back. So an eviction while the plan runs never takes
// the inputs of the step that runs next, but may take a storage that only a
// later step reads, rebuilt or resident when the plan was made. Before it
// runs a step, the caller checks that its inputs are resident and rebuilds
// any that are not with a plan of its own (DTR's recursive rematerialization;
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

// planStepDone advances the innermost plan that step st (a re-run or a
// swap-in just reported) belongs to: for a re-run, the plan whose held step
// runs st.Op; for a swap-in, one with that swap-in among its steps before
// the held one. The inputs of the plan's next re-run step are locked before
// those of the step that ran are unlocked (an input both read stays locked
// throughout). A finished plan is forgotten. A report that matches no plan
// changes nothing.
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
		if p.held < 0 {
			// Done (trailing swap-ins lock nothing): forget the plan,
			// keeping the steps buffer of the last slot for reuse.
			last := len(e.plans) - 1
			done := e.plans[i]
			copy(e.plans[i:], e.plans[i+1:])
			e.plans[last] = done
			e.plans = e.plans[:last]
		}
		for _, in := range e.g.Op(ran).Inputs {
			if err := e.unlockStorage(e.g.Tensor(in).Storage); err != nil {
				return fmt.Errorf("releasing the plan's hold on the inputs of op %d: %w", ran, err)
			}
		}
		return nil
	}
	return nil
}

// PlanHolds returns the number of committed plans that still hold the inputs
// of a step (plans not run to the end).
func (e *Engine) PlanHolds() int { return len(e.plans) }
