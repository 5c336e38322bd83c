// References, locks and pins, and what happens to a storage the program
// no longer references: eager eviction, banishing, the queue of freed storages.
// See doc.go for the design.

package evict

import (
	"fmt"

	rc "github.com/memscale/memscale/recompute"
)

// Lock keeps t's storage from being evicted until the matching Unlock.
func (e *Engine) Lock(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: lock: %w", err)
	}
	e.g.Storage(x.Storage).Locks++
	e.refresh(x.Storage)
	return nil
}

// Unlock releases one Lock of t's storage.
func (e *Engine) Unlock(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: unlock: %w", err)
	}
	return e.unlockStorage(x.Storage)
}

func (e *Engine) unlockStorage(s rc.StorageID) error {
	st := e.g.Storage(s)
	if st.Locks <= 0 {
		return fmt.Errorf("evict: unlock: storage of tensor %d is not locked", st.Root)
	}
	st.Locks--
	if st.Locks == 0 && st.Refs == 0 {
		e.unreferenced(s, false)
	}
	e.refresh(s)
	return nil
}

// Pin keeps t's storage resident for good. t must be resident.
func (e *Engine) Pin(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: pin: %w", err)
	}
	if !e.g.IsResident(t) {
		return fmt.Errorf("evict: pin: tensor %d is not resident (storage %s)", t, e.g.Storage(x.Storage).State)
	}
	st := e.g.Storage(x.Storage)
	e.uncountPinned(x.Storage, st)
	if st.Pins <= 0 {
		e.setFlag(x.Storage, flagRegPin, false) // pinned later, whatever it was before
	}
	st.Pins++
	e.countPinned(x.Storage, st)
	e.refresh(x.Storage)
	e.recRef(rc.KindPin, t)
	return nil
}

// Unpin releases one Pin of t's storage.
func (e *Engine) Unpin(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: unpin: %w", err)
	}
	st := e.g.Storage(x.Storage)
	if st.Pins <= 0 {
		return fmt.Errorf("evict: unpin: tensor %d is not pinned", t)
	}
	e.uncountPinned(x.Storage, st)
	st.Pins--
	e.countPinned(x.Storage, st)
	if st.Pins == 0 && st.Refs == 0 && st.Locks == 0 {
		e.unreferenced(x.Storage, true)
	}
	e.refresh(x.Storage)
	return nil
}

// Retain adds a reference to t (the program made another name for it). t
// must hold a reference already.
func (e *Engine) Retain(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: retain: %w", err)
	}
	st := e.g.Storage(x.Storage)
	if x.Refs <= 0 {
		return fmt.Errorf("evict: retain: tensor %d has no references left (it was released)", t)
	}
	x.Refs++
	st.Refs++
	e.recRef(rc.KindCopy, t)
	return nil
}

// Release drops one reference to t. When its storage has no references left
// it is evicted at once (eager eviction) if it can be recomputed, and
// banished (freed for good) once nothing that is still referenced can need
// it. Storages freed this way are handed out by the next Evict call.
func (e *Engine) Release(t rc.TensorID) error {
	if err := e.release(t); err != nil {
		return err
	}
	e.recRef(rc.KindRelease, t)
	return nil
}

func (e *Engine) release(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: release: %w", err)
	}
	if x.Refs <= 0 {
		return fmt.Errorf("evict: release: tensor %d has no references left", t)
	}
	x.Refs--
	st := e.g.Storage(x.Storage)
	st.Refs--
	if st.Refs == 0 {
		e.unreferenced(x.Storage, st.Locks == 0)
	}
	return nil
}

// unreferenced handles a storage that has no references: left by Release
// (released), or by Unlock of a storage that was rebuilt only to recompute
// something else, or released while locked. A locked storage is handled when
// its last lock goes. In default mode a storage nothing can need any more
// (no live dependents) is banished, and with an unlimited budget (and no
// Config.Stress) every unreferenced storage is freed. Otherwise a storage
// whose last reference was just released is dropped at once if it is
// resident and recomputable (eager eviction; it stays recomputable for its
// dependents), and one that was only rebuilt stays resident as a candidate
// that goes before any referenced storage (see key); in simulator mode as an
// ordinary candidate. One that a re-run step of an open plan still reads
// (softHeld) is not dropped either: it stays, a reserve candidate, and goes
// first once the plan no longer reads it.
// Unless DropNeededReleased, one that an evicted referenced storage was
// computed from is neither dropped nor ranked first (see feedsEvicted).
func (e *Engine) unreferenced(s rc.StorageID, released bool) {
	st := e.g.Storage(s)
	if st.State == rc.Released || st.Locks > 0 {
		return
	}
	if !e.cfg.SimulatorCompat {
		switch {
		case e.cfg.Budget == 0 && !e.cfg.Stress:
			// Nothing will be evicted, so nothing needs the lineage of
			// an unreferenced storage: free it now. Its dependents lose
			// the ability to be recomputed, should a budget be set later.
			// (Stress evicts whatever the budget.)
			e.detach(s)
			return
		case st.LiveChildren == 0:
			e.banish(s)
			return
		}
	}
	if released && st.State == rc.Resident && st.Pins == 0 && !st.NoRecompute && !e.feedsEvicted(st) && !e.softHeld(s) {
		e.dropStorage(s)
		e.stats.EagerEvictions++
		e.queue(Victim{Tensor: st.Root, Action: Drop, Size: st.Size}, ReasonEager)
		return
	}
	if st.State == rc.Evicted {
		e.notNeeded(s) // its resident released parents may rank first now
	}
	e.sel.lowered(s) // its key now sorts it first (unless keepNeeded keeps it)
}

func (e *Engine) queue(v Victim, why EvictReason) {
	if e.cfg.OnEvict != nil {
		e.cfg.OnEvict(v, why)
	}
	if e.pendAt == len(e.pending) {
		e.pending, e.pendAt = e.pending[:0], 0
	}
	e.pending = append(e.pending, v)
}

// detach frees s for good and makes its dependents non-recomputable.
func (e *Engine) detach(s rc.StorageID) {
	st := e.g.Storage(s)
	for _, c := range st.Children {
		cs := e.g.Storage(c)
		if cs.State != rc.Released && !cs.NoRecompute {
			cs.NoRecompute = true
			e.refresh(c)
		}
	}
	e.banish(s)
}

// banish frees s for good, then every parent that is left with no
// references and no live children.
func (e *Engine) banish(s rc.StorageID) {
	work := append(e.scratch[:0], s)
	for len(work) > 0 {
		s := work[len(work)-1]
		work = work[:len(work)-1]
		st := e.g.Storage(s)
		if st.State == rc.Released {
			continue
		}
		prev := st.State
		if prev == rc.Resident {
			e.uncountPinned(s, st)
			e.usage -= st.Size
		}
		if prev == rc.Resident || prev == rc.Swapped {
			e.queue(Victim{Tensor: st.Root, Action: Drop, Size: st.Size}, ReasonBanish)
		}
		e.sel.remove(s)
		e.g.Release(s)
		e.tr.released(s, prev)
		e.stats.Banished++
		for _, p := range st.Parents {
			ps := e.g.Storage(p)
			if prev == rc.Evicted {
				e.parentNotNeeded(ps, p)
			}
			ps.LiveChildren--
			if ps.LiveChildren == 0 && ps.Refs == 0 && ps.Locks == 0 && ps.State != rc.Released && !e.cfg.SimulatorCompat {
				work = append(work, p)
			}
		}
	}
	e.scratch = work[:0]
}
