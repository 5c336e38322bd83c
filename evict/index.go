package evict

import (
	"math"

	rc "github.com/memscale/memscale/recompute"
)

// never is the melt time of a comparison that never changes.
const never = math.MaxInt64

// indexSelector is the candidate index: a kinetic tournament tree over the
// candidates' keys. Every internal node holds the winner of its subtree (the
// storage evicted first) at the current clock and the earliest clock at
// which that could change (its "melt" time): a staleness score a/(T-L) is a
// hyperbola in T, and two of them cross at most once, so each comparison is
// valid until a computable instant. Picking the victim is reading the root
// after refreshing the nodes whose melt time has passed; inserting, removing
// or re-keying a candidate recomputes one leaf-to-root path.
//
// Keys are allowed to be stale in one direction only: a stored key may
// understate the true score (the neighbourhood cost grew, the storage was
// accessed again, an open plan reads it, or reads it sooner: a reserve key)
// but never overstate it. Increases are therefore applied
// lazily: the root's stored key is compared with the true one, and if it
// understates it the leaf is re-keyed and the root read again. When the
// root's key is exact it is the true minimum, because every other stored key
// is at most its true score. Whatever can lower a score (a neighbour
// brought back, a storage released) re-keys the affected storages eagerly
// (or, for a neighbourhood cost that fell, every key pick corrected: fell),
// and so does a storage becoming a candidate, but with a lower bound of the
// true key (Engine.lowKey) that is cheap to compute where the true one is
// not (the region heuristics walk the evicted neighbourhood for it): the
// true key of a storage is then only computed when it reaches the root. A
// storage gets at most one such correction per bound stored, so this never
// computes more true keys than re-keying with them eagerly would, and many
// storages are re-keyed again, or stop being candidates, before they ever
// reach the root.
// The result is the victim an exact scan over all candidates returns, which
// the property test in index_test.go checks over random engine histories.
type indexSelector struct {
	e     *Engine
	stale bool

	slotOf []int32        // per storage: leaf slot, -1 if not a candidate
	owner  []rc.StorageID // per slot: the storage in it
	keys   []key          // per slot: stored key
	// exact[sl] is set while slot sl holds a true key that pick stored (a
	// correction): the only keys that a fall of a neighbourhood cost (fell)
	// can make overstate the score. exactSlots lists them, with stale
	// entries (exact cleared since) skipped when read.
	exact      []bool
	exactSlots []int32
	resets     uint64  // keys fell re-keyed (for the property test)
	free       []int32 // unused slots
	win        []int32 // per node (1..2n-1): winning slot, -1 if empty
	melt       []int64 // per node: clock at which win may change
	n          int     // number of leaves (power of two)
	count      int
	seq        uint64
	now        int64 // clock the tree is valid at
}

func newIndexSelector(e *Engine) selector {
	x := &indexSelector{e: e, stale: e.stale}
	x.grow(64)
	return x
}

// grow doubles the leaves until there are at least n, rebuilding the tree.
func (x *indexSelector) grow(n int) {
	size := 1
	for size < n {
		size *= 2
	}
	old := x.n
	x.n = size
	x.win = make([]int32, 2*size)
	x.melt = make([]int64, 2*size)
	keys := make([]key, size)
	owner := make([]rc.StorageID, size)
	exact := make([]bool, size)
	copy(keys, x.keys)
	copy(owner, x.owner)
	copy(exact, x.exact)
	x.keys, x.owner, x.exact = keys, owner, exact
	for i := range x.win {
		x.win[i] = -1
		x.melt[i] = never
	}
	for s := range x.slotOf {
		if sl := x.slotOf[s]; sl >= 0 {
			x.win[size+int(sl)] = sl
		}
	}
	for sl := size - 1; sl >= old; sl-- {
		x.free = append(x.free, int32(sl))
	}
	for i := size - 1; i >= 1; i-- {
		x.recompute(i)
	}
}

func (x *indexSelector) len() int { return x.count }

func (x *indexSelector) slot(s rc.StorageID) int32 {
	if int(s) < len(x.slotOf) {
		return x.slotOf[s]
	}
	return -1
}

func (x *indexSelector) add(s rc.StorageID) {
	if x.slot(s) >= 0 {
		return
	}
	for int(s) >= len(x.slotOf) {
		x.slotOf = append(x.slotOf, -1)
	}
	x.advance(x.e.clock)
	if len(x.free) == 0 {
		x.grow(2 * x.n)
	}
	sl := x.free[len(x.free)-1]
	x.free = x.free[:len(x.free)-1]
	x.slotOf[s] = sl
	x.owner[sl] = s
	x.seq++
	k := x.e.lowKey(s)
	k.seq = x.seq
	x.keys[sl] = k
	x.exact[sl] = false
	x.count++
	x.win[x.n+int(sl)] = sl
	x.fix(sl)
}

func (x *indexSelector) remove(s rc.StorageID) {
	sl := x.slot(s)
	if sl < 0 {
		return
	}
	x.advance(x.e.clock)
	x.slotOf[s] = -1
	x.exact[sl] = false
	x.free = append(x.free, sl)
	x.count--
	x.win[x.n+int(sl)] = -1
	x.fix(sl)
}

func (x *indexSelector) lowered(s rc.StorageID) {
	sl := x.slot(s)
	if sl < 0 {
		return
	}
	x.advance(x.e.clock)
	x.rekey(sl)
}

// rekey stores a current lower-bound key of the storage in slot sl (see
// Engine.lowKey).
func (x *indexSelector) rekey(sl int32) {
	k := x.e.lowKey(x.owner[sl])
	k.seq = x.keys[sl].seq
	x.keys[sl] = k
	x.exact[sl] = false
	x.fix(sl)
}

// fell re-keys every slot holding a true key that pick stored to a lower
// bound (Engine.lowKey): those are the only stored keys a fall of a
// neighbourhood cost can make overstate a score, since every other one was
// built from the cost's bound, which no neighbourhood changes. Each such
// slot was set by one correction, so the work is amortised over the picks
// that made them: O(log n) per correction, however many storages' costs
// fell.
func (x *indexSelector) fell() {
	if len(x.exactSlots) == 0 {
		return
	}
	x.advance(x.e.clock)
	for _, sl := range x.exactSlots {
		if x.exact[sl] {
			x.rekey(sl)
			x.resets++
		}
	}
	x.exactSlots = x.exactSlots[:0]
}

// markExact records that slot sl holds a true key stored by pick.
func (x *indexSelector) markExact(sl int32) {
	if x.exact[sl] {
		return
	}
	x.exact[sl] = true
	x.exactSlots = append(x.exactSlots, sl)
	if len(x.exactSlots) > 2*x.n {
		// drop the stale entries, so that the list stays within the
		// number of slots however long no cost falls
		live := x.exactSlots[:0]
		for _, s := range x.exactSlots {
			if x.exact[s] {
				x.exact[s] = false // set again below, once per slot
				live = append(live, s)
			}
		}
		for _, s := range live {
			x.exact[s] = true
		}
		x.exactSlots = live
	}
}

// pick returns the root's winner once its stored key is its true key. Each
// round stores one candidate's true key, and a stored true key compares
// equal to itself (sameNumerator: bit for bit, NaN included), so a
// candidate is corrected at most once per pick: the loop ends after at most
// len()+1 rounds whatever the scores. The bound is checked anyway: past it
// the current winner is returned.
func (x *indexSelector) pick(now int64) (rc.StorageID, bool) {
	x.advance(now)
	for round := 0; ; round++ {
		w := x.win[1]
		if w < 0 {
			return 0, false
		}
		k := x.e.key(x.owner[w])
		st := x.keys[w]
		if round > x.count || sameNumerator(k.a, st.a) && k.dead == st.dead && k.reserve == st.reserve && k.due == st.due && (k.l == st.l || !x.stale) {
			return x.owner[w], true
		}
		// The stored key understated the score: store the true one and
		// look again.
		k.seq = st.seq
		x.keys[w] = k
		x.markExact(w)
		x.fix(w)
	}
}

// fix recomputes the path from leaf slot sl to the root after the leaf
// changed. It stops at the first node whose winner and melt time come out
// unchanged, unless that winner is sl itself (whose key may have changed):
// the nodes above then see exactly the inputs they were computed from, and a
// node's outcome does not change before its melt time, so recomputing them
// would give them their current values again. (The property test checks the
// tree against one built from scratch.)
func (x *indexSelector) fix(sl int32) {
	for i := (x.n + int(sl)) / 2; i >= 1; i /= 2 {
		w, m := x.win[i], x.melt[i]
		x.recompute(i)
		if x.win[i] == w && x.melt[i] == m && w != sl {
			return
		}
	}
}

// advance brings every node whose melt time has passed up to date for
// clock now.
func (x *indexSelector) advance(now int64) {
	x.now = now
	if x.melt[1] <= now {
		x.refresh(1)
	}
}

// refresh recomputes the stale nodes below and at i (depth is log2 of the
// number of candidates).
func (x *indexSelector) refresh(i int) {
	if i >= x.n || x.melt[i] > x.now {
		return
	}
	x.refresh(2 * i)
	x.refresh(2*i + 1)
	x.recompute(i)
}

// recompute sets node i from its children, which must be valid at x.now.
func (x *indexSelector) recompute(i int) {
	l, r := 2*i, 2*i+1
	a, b := x.win[l], x.win[r]
	switch {
	case a < 0:
		x.win[i], x.melt[i] = b, x.melt[r]
		return
	case b < 0:
		x.win[i], x.melt[i] = a, x.melt[l]
		return
	}
	ka, kb := &x.keys[a], &x.keys[b]
	first := before(*ka, *kb, x.now, x.stale)
	m := min(x.melt[l], x.melt[r])
	if x.stale {
		m = min(m, flipTime(*ka, *kb, x.now, first))
	}
	if first {
		x.win[i] = a
	} else {
		x.win[i] = b
	}
	x.melt[i] = m
}

// flipTime returns the first clock after now at which before(x, y, t)
// differs from cur = before(x, y, now), or never. The score a/(T-L) of each
// key is a hyperbola in T; x goes first while a_x*(T-L_y) < a_y*(T-L_x), a
// condition linear in T, so the outcome changes at most once. Its float
// estimate is checked and corrected with the exact comparison.
func flipTime(x, y key, now int64, cur bool) int64 {
	if x.dead != y.dead || x.reserve != y.reserve || x.due != y.due {
		return never
	}
	if x.l >= now || y.l >= now {
		// a staleness of zero scores +Inf: the next tick is finite
		// (a saturated clock has no next tick)
		if now == never {
			return never
		}
		return now + 1
	}
	if sameNumerator(x.a, y.a) || rank(x.a) != 1 || rank(y.a) != 1 {
		// same numerator: the older one stays first (or a tie, broken
		// by seq, forever); a numerator that is not finite and positive
		// scores the same at every clock (0 or above every finite one)
		return never
	}
	// As T grows the smaller numerator wins; if it already does, nothing
	// changes any more.
	if (x.a < y.a) == cur {
		return never
	}
	at := func(t int64) bool { return before(x, y, t, true) }
	est := (x.a*float64(y.l) - y.a*float64(x.l)) / (x.a - y.a)
	lo, hi := now, int64(never)
	if est > float64(now) && est < 9e18 {
		c := int64(est)
		// bracket [c-2, c+2] around the estimate
		if c-2 > now && at(c-2) == cur {
			lo = c - 2
		}
		if at(c+2) != cur {
			hi = c + 2
		}
	}
	if hi == never {
		// exponential search upwards from lo, up to the last clock before
		// never (a clock that reaches never refreshes every node: advance)
		step := int64(1)
		for {
			t := lo + step
			if t < lo || t >= never-1 {
				t = never - 1
			}
			if t <= lo {
				return never
			}
			if at(t) != cur {
				hi = t
				break
			}
			if t == never-1 {
				return never
			}
			lo = t
			step *= 2
		}
	}
	// smallest t in (lo, hi] with at(t) != cur
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if at(mid) == cur {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}
