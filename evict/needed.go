package evict

import (
	"fmt"

	rc "github.com/memscale/memscale/recompute"
)

// keepNeeded reports whether released storages that an evicted referenced
// storage needs are kept (the default; see Config.DropNeededReleased).
func (e *Engine) keepNeeded() bool {
	return !e.cfg.DropNeededReleased && !e.cfg.SimulatorCompat
}

// feedsEvicted reports whether, when keepNeeded, st is a storage the
// program released (no references) that must not go first: an evicted
// storage that the program still references was computed from it directly,
// so dropping st would make rebuilding that storage re-run whatever st came
// from as well. Only direct children count: an evicted child that is itself
// unreferenced was kept by nothing, and the common case (autograd: a
// gradient computed from an intermediate the backward op then releases) is
// one step.
func (e *Engine) feedsEvicted(st *rc.Storage) bool {
	if !e.keepNeeded() || st.Refs != 0 {
		return false
	}
	for _, c := range st.Children {
		if cs := e.g.Storage(c); cs.State == rc.Evicted && cs.Refs > 0 {
			return true
		}
	}
	return false
}

// notNeeded is called when storage s stopped being an evicted, referenced
// storage (it came back, or lost its last reference while evicted): when
// keepNeeded, its released resident parents that it kept from
// ranking first may rank first now, a lower key the candidate index must
// be told about.
func (e *Engine) notNeeded(s rc.StorageID) {
	if !e.keepNeeded() {
		return
	}
	for _, p := range e.g.Storage(s).Parents {
		e.parentNotNeeded(e.g.Storage(p), p)
	}
}

// parentNotNeeded tells the index that released resident storage p may rank
// first now.
func (e *Engine) parentNotNeeded(ps *rc.Storage, p rc.StorageID) {
	if e.keepNeeded() && ps.Refs == 0 && ps.State == rc.Resident {
		e.sel.lowered(p)
	}
}

// whyNoneEvictable describes the resident storages when none can be evicted
// (for the error of Evict): how many, and what keeps each one: locks (and
// how many of those storages are inputs of a step a committed plan holds),
// pins, the minimum size, or having no way back (not recomputable, no
// swapping).
func (e *Engine) whyNoneEvictable() string {
	var n, locked, pinned, small, lost, capped int
	var bytes, lockedBytes uint64
	for s := 0; s < e.g.NumStorages(); s++ {
		st := e.g.Storage(rc.StorageID(s))
		if st.State != rc.Resident {
			continue
		}
		n++
		bytes += st.Size
		switch {
		case st.Pins > 0:
			pinned++
		case st.Locks > 0:
			locked++
			lockedBytes += st.Size
		case (st.Size == 0 && !e.cfg.SimulatorCompat) || st.Size < e.cfg.EvicteeMinSize:
			small++
		case st.NoRecompute && e.cfg.SwapBandwidth <= 0:
			lost++
		case e.offloadBlocked(st):
			capped++
		}
	}
	held := 0
	if len(e.plans) > 0 {
		m := e.g.Mark()
		for _, p := range e.plans {
			for _, in := range e.g.Op(p.steps[p.held].Op).Inputs {
				s := e.g.Tensor(in).Storage
				if st := e.g.Storage(s); st.State == rc.Resident && st.Pins == 0 && !e.g.Marked(s, m) {
					e.g.SetMark(s, m)
					held++
				}
			}
		}
	}
	plans := ""
	if len(e.plans) > 0 {
		plans = fmt.Sprintf("; %d of them inputs of the next step of %d unfinished rematerialization plans", held, len(e.plans))
	}
	offload := ""
	if capped > 0 {
		offload = fmt.Sprintf(", %d not recomputable whose swap would pass the offload limit of %d bytes (%d swapped out)",
			capped, e.cfg.OffloadLimit, e.g.SwappedBytes())
	}
	return fmt.Sprintf("%d resident storages, %d bytes: %d pinned, %d locked (%d bytes%s), %d under the minimum evictee size, %d not recomputable%s",
		n, bytes, pinned, locked, lockedBytes, plans, small, lost, offload)
}
