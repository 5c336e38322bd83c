package evict

import (
	rc "github.com/memscale/memscale/recompute"
)

// feedsEvicted reports whether, with KeepNeededReleased, st is a storage the
// program released (no references) that must not go first: an evicted
// storage that the program still references was computed from it directly,
// so dropping st would make rebuilding that storage re-run whatever st came
// from as well. Only direct children count: an evicted child that is itself
// unreferenced was kept by nothing, and the common case (autograd: a
// gradient computed from an intermediate the backward op then releases) is
// one step.
func (e *Engine) feedsEvicted(st *rc.Storage) bool {
	if !e.cfg.KeepNeededReleased || e.cfg.SimulatorCompat || st.Refs != 0 {
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
// storage (it came back, or lost its last reference while evicted): with
// KeepNeededReleased, its released resident parents that it kept from
// ranking first may rank first now, a lower key the candidate index must
// be told about.
func (e *Engine) notNeeded(s rc.StorageID) {
	if !e.cfg.KeepNeededReleased || e.cfg.SimulatorCompat {
		return
	}
	for _, p := range e.g.Storage(s).Parents {
		e.parentNotNeeded(e.g.Storage(p), p)
	}
}

// parentNotNeeded tells the index that released resident storage p may rank
// first now.
func (e *Engine) parentNotNeeded(ps *rc.Storage, p rc.StorageID) {
	if e.cfg.KeepNeededReleased && !e.cfg.SimulatorCompat && ps.Refs == 0 && ps.State == rc.Resident {
		e.sel.lowered(p)
	}
}
