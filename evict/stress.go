// Stress mode (Config.Stress): every evictable storage is evicted as soon as
// no running op needs it. See doc.go for the design.

package evict

import rc "github.com/memscale/memscale/recompute"

// stressNote queues candidate s for the next Evict, unless it is queued
// already or was rebuilt (refresh calls it for every storage that is a
// candidate after a change, with Config.Stress).
func (e *Engine) stressNote(s rc.StorageID) {
	if e.flag(s, flagRebuilt|flagQueued) {
		return
	}
	e.setFlag(s, flagQueued, true)
	if e.stressAt == len(e.stressQ) {
		e.stressQ, e.stressAt = e.stressQ[:0], 0
	}
	e.stressQ = append(e.stressQ, s)
}

// stressEvict is the budget loop of Config.Stress, after the n pending
// storages written to out: it evicts every queued storage that is still a
// candidate and was not rebuilt (drop or swap, as the budget loop would;
// counted in Evictions or SwapsOut and BytesEvicted; OnEvict with
// ReasonBudget), in the order they became candidates, writing them to out
// up to len(out), and returns the count written. A storage that is not a
// candidate when its turn comes (locked, pinned, gone) leaves the queue;
// refresh queues it again when it is one again. So does a reserve candidate
// (a storage that a re-run step of an open plan still reads: stress evicts
// only what no running op or open plan needs), which softRelease
// queues again when the last such step is reported. With an empty queue it
// costs nothing.
func (e *Engine) stressEvict(out []Victim, n int) int {
	for n < len(out) && e.stressAt < len(e.stressQ) {
		s := e.stressQ[e.stressAt]
		e.stressAt++
		e.setFlag(s, flagQueued, false)
		if e.flag(s, flagRebuilt) || e.softHeld(s) || !e.eligible(e.g.Storage(s)) {
			continue
		}
		out[n] = e.evictStorage(s)
		if e.cfg.OnEvict != nil {
			e.cfg.OnEvict(out[n], ReasonBudget)
		}
		n++
	}
	return n
}

// markRebuilt records, with Config.Stress, that the storages ss came back
// (re-run or swapped in), before refresh sees them: stress does not evict
// them again.
func (e *Engine) markRebuilt(ss ...rc.StorageID) {
	if !e.cfg.Stress {
		return
	}
	for _, s := range ss {
		e.setFlag(s, flagRebuilt, true)
	}
}
