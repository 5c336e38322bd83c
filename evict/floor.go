// The step's minimum budget: the pinned totals, the floor of each op, and
// the error text of a budget below what the step needs.
// See doc.go for the design.

package evict

import (
	"fmt"

	"github.com/memscale/memscale/internal/bytesize"
	rc "github.com/memscale/memscale/recompute"
)

// Per-storage bits of Engine.flags.
const (
	// flagRegPin: the storage's pins date from its registration
	// (NewTensor with pinned, or an in-place op's new version of such a
	// storage), not from Pin.
	flagRegPin uint8 = 1 << iota
	// flagRebuilt: with Config.Stress, the storage was rematerialized or
	// swapped in; stress does not evict it again.
	flagRebuilt
	// flagQueued: with Config.Stress, the storage is in the stress queue.
	flagQueued
)

// MinBudgetParts is the step's minimum budget so far and its parts: at the
// op (or re-run) where the bytes that had to be resident together were the
// most, the pinned resident storages and the op's own storages. No budget
// below Bytes can run the step: every part was resident at once.
type MinBudgetParts struct {
	// PinnedAtRegistration is the bytes of the resident storages pinned
	// when they were registered (NewTensor with pinned: parameters,
	// inputs), PinnedLater those pinned later by Pin (gradients).
	PinnedAtRegistration uint64 `json:"pinned_at_registration"`
	PinnedLater          uint64 `json:"pinned_later"`
	// UnderMinSize is the bytes of the resident unpinned storages smaller
	// than the minimum evictee size (Config.EvicteeMinSize): never evicted,
	// so they had to fit as well.
	UnderMinSize uint64 `json:"under_min_size"`
	// OpBytes is the bytes of the distinct storages among the op's inputs
	// and outputs that are not pinned (for an in-place op, its inputs: the
	// new versions live in their memory).
	OpBytes uint64 `json:"op_bytes"`
	// Op is the op's name ("" before the first op).
	Op string `json:"op"`
}

// Bytes is the minimum budget: the sum of the parts.
func (m MinBudgetParts) Bytes() uint64 {
	return m.PinnedAtRegistration + m.PinnedLater + m.UnderMinSize + m.OpBytes
}

// MinBudget returns the step's minimum budget so far and its parts. It is
// tracked whatever the budget (an engine with no budget measures it).
func (e *Engine) MinBudget() MinBudgetParts { return e.minBudget }

// PinnedBytes returns the bytes of the resident pinned storages, pinned at
// registration (NewTensor) and later (Pin).
func (e *Engine) PinnedBytes() (atRegistration, later uint64) { return e.pinnedReg, e.pinnedLater }

// flag reports whether storage s has any of the bits f.
func (e *Engine) flag(s rc.StorageID, f uint8) bool {
	return int(s) < len(e.flags) && e.flags[s]&f != 0
}

// setFlag sets (on) or clears the bits f of storage s. Clearing a storage
// past the end of flags grows nothing.
func (e *Engine) setFlag(s rc.StorageID, f uint8, on bool) {
	if !on {
		if int(s) < len(e.flags) {
			e.flags[s] &^= f
		}
		return
	}
	if int(s) >= len(e.flags) {
		n := max(int(s)+1, e.g.NumStorages())
		e.flags = append(e.flags, make([]uint8, n-len(e.flags))...)
	}
	e.flags[s] |= f
}

// pinnedTotal returns the total of never-evicted bytes that s's bytes count
// in: pinnedReg or pinnedLater for a pinned storage, small for an unpinned
// one under the minimum evictee size; nil when they count in none (s is not
// resident, or is an ordinary unpinned storage).
func (e *Engine) pinnedTotal(s rc.StorageID, st *rc.Storage) *uint64 {
	switch {
	case st.State != rc.Resident:
		return nil
	case st.Pins > 0 && e.flag(s, flagRegPin):
		return &e.pinnedReg
	case st.Pins > 0:
		return &e.pinnedLater
	case st.Size > 0 && st.Size < e.cfg.EvicteeMinSize:
		return &e.small
	}
	return nil
}

// countPinned adds s's bytes to its total (pinnedTotal), after s became
// resident or pinned. uncountPinned takes them away, before s stops being
// resident or pinned. Both do nothing for a storage that counts in none.
func (e *Engine) countPinned(s rc.StorageID, st *rc.Storage) {
	if p := e.pinnedTotal(s, st); p != nil {
		*p += st.Size
	}
}

func (e *Engine) uncountPinned(s rc.StorageID, st *rc.Storage) {
	if p := e.pinnedTotal(s, st); p != nil {
		*p -= st.Size
	}
}

// noteFloor evaluates the floor at an op that has the storages of ins and
// outs resident together (name is the op's): the pinned totals and the
// small storages plus the bytes of those distinct storages that are not
// counted in them, and keeps the largest (MinBudget).
// O(len(ins)+len(outs)), no allocation.
func (e *Engine) noteFloor(name string, ins, outs []rc.TensorID) {
	m := e.g.Mark()
	b := e.opBytes(ins, m, 0)
	b = e.opBytes(outs, m, b)
	if e.pinnedReg+e.pinnedLater+e.small+b > e.minBudget.Bytes() {
		e.minBudget = MinBudgetParts{PinnedAtRegistration: e.pinnedReg, PinnedLater: e.pinnedLater,
			UnderMinSize: e.small, OpBytes: b, Op: name}
	}
}

// opBytes adds to b the sizes of the storages of ts not marked m yet, and
// marks them, less those the pinned and small totals count.
func (e *Engine) opBytes(ts []rc.TensorID, m uint64, b uint64) uint64 {
	for _, t := range ts {
		s := e.g.Tensor(t).Storage
		if e.g.Marked(s, m) {
			continue
		}
		e.g.SetMark(s, m)
		if st := e.g.Storage(s); e.pinnedTotal(s, st) == nil {
			b += st.Size
		}
	}
	return b
}

// lockedBytes returns the bytes of the resident storages that are locked
// and counted in no total (not pinned, not small; an error path: it scans
// every storage).
func (e *Engine) lockedBytes() uint64 {
	var n uint64
	for s := 0; s < e.g.NumStorages(); s++ {
		if st := e.g.Storage(rc.StorageID(s)); st.State == rc.Resident && st.Locks > 0 && e.pinnedTotal(rc.StorageID(s), st) == nil {
			n += st.Size
		}
	}
	return n
}

// floorNow is what the step needs resident at this point: the pinned
// totals, the locked storages (the running op's inputs, a plan's held
// step) and extra, the bytes about to be allocated.
type floorNow struct {
	reg, later, small, locked, extra uint64
	// most is the step's minimum budget so far.
	most MinBudgetParts
	// plans is the number of unfinished rematerialization plans (HoldPlan)
	// whose held inputs are among the locked bytes.
	plans int
	// finished: the engine is finished (Finish), so the locked bytes and
	// extra are what leaves the step (the caller makes it resident).
	finished bool
}

func (e *Engine) floorNow(extra uint64) floorNow {
	return floorNow{reg: e.pinnedReg, later: e.pinnedLater, small: e.small, locked: e.lockedBytes(), extra: extra,
		most: e.minBudget, plans: len(e.plans), finished: e.finished}
}

// Op names of MinBudgetParts for a point where the budget loop found no
// room (noteNeed): during the step, and at its end (Finish).
const (
	pointOp = "a point that found no room"
	leaveOp = "what leaves the step"
)

// noteNeed keeps the point f as the step's minimum budget when it is a
// bound - no plan holds inputs, so everything pinned, locked and requested
// had to be resident at once - larger than the minimum so far (f.most
// follows). The budget loop calls it when it fails: the minimum budget a
// failed step reports (Stats, the summaries) is the one its error names.
func (e *Engine) noteNeed(f *floorNow) {
	if f.plans > 0 || f.bytes() <= e.minBudget.Bytes() {
		return
	}
	op := pointOp
	if f.finished {
		op = leaveOp
	}
	e.minBudget = MinBudgetParts{PinnedAtRegistration: f.reg, PinnedLater: f.later, UnderMinSize: f.small,
		OpBytes: f.locked + f.extra, Op: op}
	f.most = e.minBudget
}

func (f floorNow) bytes() uint64 { return f.reg + f.later + f.small + f.locked + f.extra }

// smallPart is the floor's part for the small storages ("" when none).
func (f floorNow) smallPart(h func(uint64) string) string {
	if f.small == 0 {
		return ""
	}
	return h(f.small) + " under the minimum evictee size (never evicted) + "
}

// below returns, when budget is below f, a sentence that says so and names
// the parts and the step's minimum budget so far, followed by "; " (the
// start of an error); "" when the budget is not below f.
func (f floorNow) below(budget uint64) string {
	if budget >= f.bytes() {
		return ""
	}
	h := func(n uint64) string { return bytesize.Format(n, 1) }
	most, where := f.most.Bytes(), "largest op: "+f.most.Op
	switch {
	case (f.most.Op == pointOp || f.most.Op == leaveOp) && f.bytes() == most:
		where = "this point"
	case f.most.Op == pointOp:
		where = "an earlier point that found no room"
	case f.most.Op == leaveOp:
		where = leaveOp
	}
	if f.plans > 0 && f.bytes() > most {
		// Not a bound: what the nested plans hold depends on the engine's
		// choices, so the step's lower bound stays the largest op's.
		return fmt.Sprintf("budget %s is below what this point of the step holds: %s pinned at registration (parameters, inputs) + "+
			"%s pinned later (gradients) + %s%s locked (the running op's inputs and those held for %d unfinished "+
			"rematerialization plans, which nest at this budget) + %s requested = %s; "+
			"the step's minimum budget (a lower bound) so far is %s (%s); ",
			h(budget), h(f.reg), h(f.later), f.smallPart(h), h(f.locked), f.plans, h(f.extra), h(f.bytes()), h(most), where)
	}
	if f.bytes() > most {
		most, where = f.bytes(), "this point"
	}
	if f.finished {
		return fmt.Sprintf("budget %s is below what leaves this step: %s pinned at registration (parameters, inputs) + "+
			"%s pinned later (gradients) + %s%s resident and %s to make resident of the tensors the step hands back "+
			"(they leave it resident, and the next step starts with them); the step's minimum budget so far is %s (%s); ",
			h(budget), h(f.reg), h(f.later), f.smallPart(h), h(f.locked), h(f.extra), h(most), where)
	}
	return fmt.Sprintf("budget %s is below what this step needs at this point: %s pinned at registration (parameters, inputs) + "+
		"%s pinned later (gradients) + %s%s locked by the running op + %s requested; "+
		"the step's minimum budget so far is %s (%s); ",
		h(budget), h(f.reg), h(f.later), f.smallPart(h), h(f.locked), h(f.extra), h(most), where)
}
