// The budget loop: candidates, keys and scores, and choosing and taking out
// victims.
// See doc.go for the design.

package evict

import (
	"fmt"
	"math"
	"time"

	"github.com/memscale/memscale/internal/bytesize"
	"github.com/memscale/memscale/internal/satmath"
	rc "github.com/memscale/memscale/recompute"
)

// eligible reports whether s may be chosen as a victim.
func (e *Engine) eligible(st *rc.Storage) bool {
	return st.State == rc.Resident && st.Locks == 0 && st.Pins == 0 && (st.Size > 0 || e.cfg.SimulatorCompat) &&
		st.Size >= e.cfg.EvicteeMinSize && (!st.NoRecompute || e.cfg.SwapBandwidth > 0 && e.swapFits(st.Size))
}

// swapFits reports whether n more bytes swapped out stay within
// Config.OffloadLimit.
func (e *Engine) swapFits(n uint64) bool {
	return e.cfg.OffloadLimit == 0 || e.g.SwappedBytes()+n <= e.cfg.OffloadLimit
}

// refresh puts s into or out of the candidate set after a change.
func (e *Engine) refresh(s rc.StorageID) {
	if e.eligible(e.g.Storage(s)) {
		e.sel.add(s)
		if e.cfg.Stress {
			e.stressNote(s)
		}
	} else {
		e.sel.remove(s)
	}
}

// key returns s's current (true) key.
func (e *Engine) key(s rc.StorageID) key { return e.keyOf(s, true) }

// lowKey returns a key that never sorts s later than its true key does: the
// same key with the tracker's cheap lower bound of the cost in place of the
// cost (see tracker.bound). The candidate index stores it when a storage
// becomes a candidate or its score may have fallen, and computes the true
// key only for a storage about to be chosen. With a recomp_time_factor
// exponent (whose math.Pow is not guaranteed monotonic to the last bit) the
// bound's numerator is lowered by a relative 2^-20, far more than the
// error of a power, so that it stays below the cost's. With a zero size
// (the score does not depend on the cost) it is the true key.
func (e *Engine) lowKey(s rc.StorageID) key {
	return e.keyOf(s, e.g.Storage(s).Size == 0)
}

// keyOf returns s's key with the cost (exact) or its lower bound.
func (e *Engine) keyOf(s rc.StorageID, exact bool) key {
	st := e.g.Storage(s)
	k := key{l: st.LastAccess, id: int32(s), dead: st.Refs == 0 && !e.cfg.SimulatorCompat && !e.feedsEvicted(st)}
	if e.softHeld(s) {
		k.reserve, k.due = true, e.due(s)
	}
	switch e.h {
	case LRU:
		k.a = 1
	case Size:
		k.a = numerator(1, 0, st.Size, e.mf)
	default:
		var c int64
		if exact {
			c = e.tr.cost(s)
		} else {
			c = e.tr.bound(s)
		}
		k.a = numerator(c, e.tf, st.Size, e.mf)
		if e.h == AncSqrt {
			// a/sqrt(s) orders like a^2/s: keep the exact comparator
			k.a *= k.a
		}
		if !exact && e.tf != 1 {
			k.a = below(k.a)
		}
	}
	return k
}

// below returns a numerator under a by more than the relative error of a
// power (2^-20): 0 for one so small that the margin would round away, a
// itself for 0 and +Inf (which the cost's numerator reaches as well: the
// powers saturate monotonically).
func below(a float64) float64 {
	if a < 0x1p-900 {
		return 0
	}
	return a * (1 - 0x1p-20)
}

// numerator returns c^tf / m^mf (tf == 0: 1 / m^mf), the clock-free part
// of a score, in [0, +Inf] and never NaN: a zero size scores +Inf (evicting
// it frees nothing), a zero cost with a size 0, and where a power would
// overflow the quotient is taken through logarithms, saturating at 0 and
// +Inf. With costs in the int64 range, sizes up to rc.MaxSize and factors up
// to MaxRecompFactor no power overflows and the square anc-sqrt takes stays
// finite; the logarithms are for configurations built around validate.
func numerator(c int64, tf float64, m uint64, mf float64) float64 {
	switch {
	case m == 0 || math.IsNaN(tf) || math.IsNaN(mf):
		return math.Inf(1)
	case c <= 0 && tf != 0:
		return 0
	}
	cf, mfl := float64(c), float64(m)
	if tf == 0 {
		cf = 1
	}
	if tf == 1 && mf == 1 {
		return cf / mfl
	}
	num, den := math.Pow(cf, tf), math.Pow(mfl, mf)
	if q := num / den; !math.IsNaN(q) && !math.IsInf(num, 0) && !math.IsInf(den, 0) && den > 0 {
		return q
	}
	l := tf*math.Log(cf) - mf*math.Log(mfl)
	if math.IsNaN(l) {
		return math.Inf(1)
	}
	return math.Exp(l)
}

// Score returns t's storage's current heuristic score (lower = evicted
// first; +Inf when it was used at this very clock).
func (e *Engine) Score(t rc.TensorID) (float64, error) {
	x, err := e.tensor(t)
	if err != nil {
		return 0, fmt.Errorf("evict: score: %w", err)
	}
	sc := e.key(x.Storage).score(e.clock, e.stale)
	if e.h == AncSqrt {
		sc = math.Sqrt(sc)
	}
	return sc, nil
}

// Evict is the budget loop. It first hands out storages freed by Release
// since the last call, then, while usage + extra is over the budget, chooses
// victims, marks them evicted (or swapped) and writes them to out, up to
// len(out). If it returns len(out), call again. extra is the size of what
// the caller is about to allocate (an op's outputs, a re-run, a swap-in).
// Victims are chosen by pick: ordinary candidates first, and a storage that
// an open plan's later step still reads (a reserve candidate) only when no
// ordinary one is left.
//
// It fails, wrapping ErrNoEvictable and naming usage and budget, only when
// usage + extra is over the budget, nothing is evictable and nothing was
// written; and, before doing anything, with a *TooLargeError when extra > 0
// alone is larger than the budget - also once the engine is finished
// (Finish): what leaves the step must fit the budget too, and the error
// then says so. When the budget is below what the step needs at this point
// (the pinned storages, the locked ones and extra), the error says so
// first, naming those parts and the step's minimum budget so far
// (MinBudget), which that point becomes when it is a bound (noteNeed). Every
// call closes an open Reclaim.
//
// With Config.Stress it ignores the budget and extra: after the pending
// storages it evicts every candidate that was not rebuilt during the
// engine's life (see stressEvict), and never fails.
func (e *Engine) Evict(extra uint64, out []Victim) (int, error) {
	e.reclaimGot = 0 // closes an open Reclaim
	if e.cfg.Stress {
		return e.stressEvict(out, e.handOutPending(out)), nil
	}
	if extra > 0 && e.cfg.Budget > 0 && extra > e.cfg.Budget {
		f := e.floorNow(extra)
		e.noteNeed(&f)
		return 0, &TooLargeError{Extra: extra, Budget: e.cfg.Budget, Pinned: f.reg + f.later,
			PinnedAtRegistration: f.reg, PinnedLater: f.later, UnderMinSize: f.small, Locked: f.locked, MinBudget: f.most,
			Plans: f.plans, Finished: f.finished}
	}
	n := e.handOutPending(out)
	if e.cfg.Budget == 0 {
		if e.cfg.Usage != nil {
			e.sampled = max(e.sampled, e.cfg.Usage())
		}
		return n, nil
	}
	var gone uint64 // bytes evicted here that an external usage source still counts
	for n < len(out) {
		u := e.Usage()
		if e.cfg.Usage != nil {
			e.sampled = max(e.sampled, u)
			u = sub(u, gone)
		}
		if u+extra <= e.cfg.Budget {
			break
		}
		s, ok := e.pick()
		if !ok {
			if n > 0 {
				break
			}
			f := e.floorNow(extra)
			e.noteNeed(&f)
			return 0, fmt.Errorf("evict: %s%susage %d + %d requested > budget %d: %w (%s)",
				e.outsideNote(u, extra), f.below(e.cfg.Budget), u, extra, e.cfg.Budget, ErrNoEvictable, e.whyNoneEvictable())
		}
		out[n] = e.evictStorage(s)
		if e.cfg.OnEvict != nil {
			e.cfg.OnEvict(out[n], ReasonBudget)
		}
		gone += out[n].Size
		n++
	}
	return n, nil
}

// Finish marks the engine finished (see Engine): the program's step is
// over, and the caller is about to make resident every tensor that escapes
// it. The budget still binds: an error of the budget loop then names what
// leaves the step. Calling it again changes nothing.
func (e *Engine) Finish() { e.finished = true }

// Finished reports whether Finish was called.
func (e *Engine) Finished() bool { return e.finished }

// EvictOne evicts the best victim regardless of the budget (for a memory
// model that failed to place a block although the budget allows it).
func (e *Engine) EvictOne() (Victim, error) {
	s, ok := e.pick()
	if !ok {
		return Victim{}, fmt.Errorf("evict: usage %d, budget %d: %w", e.Usage(), e.cfg.Budget, ErrNoEvictable)
	}
	v := e.evictStorage(s)
	if e.cfg.OnEvict != nil {
		e.cfg.OnEvict(v, ReasonBudget)
	}
	return v, nil
}

// outsideNote explains an external usage source (the allocator) that counts
// more than the engine holds: memory allocated outside what was registered
// (the model's weights or tensors made before the region, other threads)
// counts against the budget and no eviction can free it. It is empty when
// that memory alone does not put usage + extra over the budget.
func (e *Engine) outsideNote(u, extra uint64) string {
	if e.cfg.Usage == nil || u <= e.usage {
		return ""
	}
	outside := u - e.usage
	if floor := e.floorNow(extra).bytes(); outside+floor <= e.cfg.Budget || (floor > e.cfg.Budget && outside < e.cfg.Budget/8) {
		return "" // evicting could make room, or the budget is too small whatever lies outside
	}
	return fmt.Sprintf("%s of the allocator's %s in use is memory this engine does not hold "+
		"(allocated outside the region, e.g. before it: the model, the optimizer state, other tensors); the budget "+
		"counts it (usage \"allocator\") and no eviction can free it: set the budget to that plus what the step "+
		"needs (peak_usage of an unbudgeted run is in the same units), or count registered bytes only (usage \"engine\"); ",
		bytesize.Format(outside, 1), bytesize.Format(u, 1))
}

func sub(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// pick returns the candidate to evict next, as the selector chooses it:
// every ordinary candidate goes before every reserve candidate (a storage
// that a re-run step of an open plan still reads, HoldPlan); reserve
// candidates go the one read last first (due), and otherwise dead storages
// go first, then the lowest score. So a plan's rebuilt intermediates and
// the resident inputs of its later steps are taken only when nothing else
// is left, and then the one its plans need last.
func (e *Engine) pick() (rc.StorageID, bool) {
	t0 := time.Now()
	e.unpark()
	s, ok := e.sel.pick(e.clock)
	for ok && e.offloadBlocked(e.g.Storage(s)) {
		// Not recomputable and its swap would pass the offload limit: out of
		// the candidates until swapped bytes come back (unpark).
		e.sel.remove(s)
		e.parked = append(e.parked, s)
		e.parkedAt = e.g.SwappedBytes()
		s, ok = e.sel.pick(e.clock)
	}
	e.stats.VictimSearches++
	e.stats.VictimSearchNS = satmath.AddInt64(e.stats.VictimSearchNS, int64(time.Since(t0)))
	return s, ok
}

// offloadBlocked reports whether st cannot be evicted now only because it
// cannot be recomputed and its swap would pass Config.OffloadLimit.
func (e *Engine) offloadBlocked(st *rc.Storage) bool {
	return e.cfg.OffloadLimit > 0 && st.NoRecompute && !e.swapFits(st.Size)
}

// unpark offers the storages pick set aside for the offload limit again once
// the swapped bytes fell below what they were then.
func (e *Engine) unpark() {
	if len(e.parked) == 0 || e.g.SwappedBytes() >= e.parkedAt {
		return
	}
	parked := e.parked
	e.parked = nil
	for _, s := range parked {
		e.refresh(s)
	}
}

// transferNS is the modelled one-way copy time of n bytes (0 when no
// bandwidth is configured: parking alone).
func (e *Engine) transferNS(n uint64) int64 {
	if e.cfg.SwapBandwidth == 0 {
		return 0
	}
	ns := float64(n) / e.cfg.SwapBandwidth * 1e9
	if !(ns < math.MaxInt64) {
		// a tiny bandwidth: the conversion would be undefined
		return math.MaxInt64
	}
	return int64(ns)
}

// evictStorage takes the victim s out of memory and says how.
func (e *Engine) evictStorage(s rc.StorageID) Victim {
	st := e.g.Storage(s)
	v := Victim{Tensor: st.Root, Action: Drop, Size: st.Size}
	e.stats.BytesEvicted = satmath.AddUint64(e.stats.BytesEvicted, st.Size)
	if e.softHeld(s) {
		e.stats.ReserveEvictions++
		if e.cfg.Park && e.swapFits(st.Size) {
			v.Action = Swap // parked: an open plan reads it again
			e.stats.Parked++
		}
	}
	if v.Action == Drop && e.cfg.SwapBandwidth > 0 {
		// swap when copying out and back is cheaper than recomputing
		if t := e.transferNS(st.Size); (st.NoRecompute || satmath.AddInt64(t, t) < e.tr.cost(s)) && e.swapFits(st.Size) {
			v.Action = Swap
		}
	}
	if v.Action == Swap {
		e.swapOut(s, st)
		return v
	}
	e.dropStorage(s)
	e.stats.Evictions++
	return v
}

// swapOut marks s swapped out to host memory (the caller copies it) and
// counts the swap and its modelled transfer time.
func (e *Engine) swapOut(s rc.StorageID, st *rc.Storage) {
	e.sel.remove(s)
	e.uncountPinned(s, st)
	e.g.SwapOut(s)
	e.usage -= st.Size
	e.stats.SwapsOut++
	e.tick(&e.stats.SwapCostNS, e.transferNS(st.Size))
}
