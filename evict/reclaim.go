// Reclaim: eviction on demand, for an allocation that failed, whatever the
// budget. See doc.go for the design.

package evict

import (
	"errors"
	"fmt"
)

// errNoRoom is Reclaim's error for an empty out: there is nowhere to write a
// victim, and a caller that calls again while the count equals len(out)
// would loop for ever.
var errNoRoom = errors.New("evict: reclaim: out has no room for a victim: pass at least one slot")

// Reclaim frees memory on demand, ignoring the budget: the allocator could
// not serve a request and asks for need bytes. It first hands out the
// storages freed since the last Evict or Reclaim (as Evict does), then
// evicts victims chosen by the heuristic (drop or swap, as the budget loop
// would) until the sizes of the victims written sum to at least need, or
// nothing more is evictable. It writes up to len(out) victims and returns
// how many.
//
// A return of len(out) leaves the reclaim open: the next Reclaim counts the
// bytes written by the open reclaim toward its need (so call again with the
// same need until it returns less than len(out)); a return below len(out),
// and any Evict, closes it.
//
// Falling short of need is not an error: Reclaim returns what it wrote
// (possibly 0) and ReclaimShortfall then says why nothing more could be
// evicted (pins, locks, plan holds, the minimum size). The only error is an
// empty out.
func (e *Engine) Reclaim(need uint64, out []Victim) (int, error) {
	if len(out) == 0 {
		return 0, errNoRoom
	}
	e.shortfall = ""
	got := e.reclaimGot
	n := e.handOutPending(out)
	for _, v := range out[:n] {
		got += v.Size
	}
	for n < len(out) && got < need {
		s, ok := e.pick()
		if !ok {
			e.shortfall = fmt.Sprintf("reclaim of %d bytes found %d: nothing more is evictable (%s)",
				need, got, e.whyNoneEvictable())
			e.stats.ReclaimShortfalls++
			break
		}
		out[n] = e.evictStorage(s)
		if e.cfg.OnEvict != nil {
			e.cfg.OnEvict(out[n], ReasonReclaim)
		}
		e.stats.ReclaimVictims++
		got += out[n].Size
		n++
	}
	e.reclaimGot = 0
	if n == len(out) {
		e.reclaimGot = got
	}
	return n, nil
}

// ReclaimShortfall says why the last Reclaim could not find the bytes it was
// asked for: the bytes asked and found, and what keeps the resident
// storages (whyNoneEvictable). It is "" when the last Reclaim found them
// (or wrote a full out, and so may find more in the next call), and when
// Reclaim was never called.
func (e *Engine) ReclaimShortfall() string { return e.shortfall }

// HandOutPending writes the pending storages to out as Evict does first,
// without running the budget loop, and returns how many it wrote; the
// caller frees them (the C ABI hands them out with the op that freed them).
func (e *Engine) HandOutPending(out []Victim) int { return e.handOutPending(out) }

// handOutPending writes the pending storages (freed by the engine and not
// handed out yet) to out, oldest first, up to len(out), and returns how many
// it wrote.
func (e *Engine) handOutPending(out []Victim) int {
	n := copy(out, e.pending[e.pendAt:])
	e.pendAt += n
	return n
}
