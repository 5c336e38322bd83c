package recompute

import (
	"errors"
	"fmt"
)

// StepKind says what a plan step does.
type StepKind uint8

// Plan step kinds (the values are the C ABI's "kinds").
const (
	// StepRerun re-runs an op; afterwards all its outputs are resident.
	StepRerun StepKind = 0
	// StepSwapIn copies a swapped storage back into device memory.
	StepSwapIn StepKind = 1
)

// Step is one action of a rematerialization plan.
type Step struct {
	// Kind is the action.
	Kind StepKind
	// Op is the op to re-run (StepRerun).
	Op OpID
	// Tensor is the root tensor of the storage to swap in (StepSwapIn).
	Tensor TensorID
}

// ErrNotRecomputable reports a tensor that is needed but can be neither
// recomputed nor swapped in.
var ErrNotRecomputable = errors.New("tensor cannot be rematerialized")

type planFrame struct {
	op   OpID
	next int32
}

// Plan returns, appended to buf, the steps that make tensor t resident:
// evicted ancestors first (every input of a step is resident when the step
// runs, counting the steps before it), each op once, all outputs of a
// multi-output op brought back by its single step. An empty plan means t is
// resident. The graph is not changed. The traversal uses an explicit stack, so
// a chain of any depth is planned without growing the goroutine stack.
func (g *Graph) Plan(t TensorID, buf []Step) ([]Step, error) {
	if err := g.CheckTensor(t); err != nil {
		return buf, err
	}
	g.epoch++
	mark := g.epoch // stamp: storage will be swapped in / op planned or on the stack
	planned := func(x TensorID) bool {
		tx := &g.tensors[x]
		s := &g.storages[tx.Storage]
		if tx.Defined && (s.State == Resident || (s.State == Swapped && s.stamp == mark)) {
			return true
		}
		return tx.Op != NoOp && g.opStamp[tx.Op] == mark+1
	}
	var stack []planFrame
	// need schedules what makes x resident; it returns an error when x cannot
	// be rebuilt.
	need := func(x TensorID) error {
		tx := &g.tensors[x]
		s := &g.storages[tx.Storage]
		if tx.Defined && s.State == Swapped {
			s.stamp = mark
			buf = append(buf, Step{Kind: StepSwapIn, Tensor: s.Root})
			return nil
		}
		switch {
		case s.State == Released:
			return fmt.Errorf("tensor %d: %w: its storage was released", x, ErrNotRecomputable)
		case tx.Op == NoOp:
			return fmt.Errorf("tensor %d: %w: it is an external tensor that was dropped", x, ErrNotRecomputable)
		case g.ops[tx.Op].Flags&NoRecompute != 0 || (tx.Alias < 0 && s.NoRecompute):
			return fmt.Errorf("tensor %d: %w: op %d (%s) cannot be re-run and the value was lost",
				x, ErrNotRecomputable, tx.Op, g.ops[tx.Op].Name)
		case g.opStamp[tx.Op] == mark:
			return fmt.Errorf("tensor %d: op %d (%s) depends on itself: lineage cycle", x, tx.Op, g.ops[tx.Op].Name)
		}
		g.opStamp[tx.Op] = mark // on the stack
		stack = append(stack, planFrame{op: tx.Op})
		return nil
	}
	if planned(t) {
		return buf, nil
	}
	if err := need(t); err != nil {
		return buf, err
	}
	for len(stack) > 0 {
		f := &stack[len(stack)-1]
		op := &g.ops[f.op]
		if int(f.next) < len(op.Inputs) {
			x := op.Inputs[f.next]
			f.next++
			if !planned(x) {
				if err := need(x); err != nil {
					return buf, fmt.Errorf("rebuilding tensor %d: %w", t, err)
				}
			}
			continue
		}
		stack = stack[:len(stack)-1]
		g.opStamp[f.op] = mark + 1 // planned: its outputs will be resident
		buf = append(buf, Step{Kind: StepRerun, Op: f.op})
	}
	g.epoch++ // mark+1 was used for planned ops
	return buf, nil
}
