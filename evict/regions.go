package evict

import (
	"github.com/memscale/memscale/internal/satmath"
	rc "github.com/memscale/memscale/recompute"
)

// regionTracker serves the neighbourhood costs of h_DTR (e*: both
// directions) and of the ancestors-only heuristics (h_MSPS, anc-sqrt).
//
// The evicted region of a material storage in one direction is the set of
// evicted storages reachable from it through evicted storages only,
// following parents (its ancestor region: what has to be re-run before it
// could be rebuilt) or children (its descendant region). Its cost is the
// storage's own compute plus the compute of its ancestor region, and for e*
// of its descendant region too. Swapped storages count as material (they
// come back by a copy) and released ones are not part of the graph: both
// end a walk like resident ones.
//
// The regions are not stored: cost walks them when it is asked. The DTR
// authors' simulator keeps every material storage's regions up to date
// instead (an eviction folds the evicted storage and its regions into the
// regions around it; a storage coming back rebuilds them all), and so did
// this tracker, with the same results; on the shared traces that upkeep did
// several times more work than answering the queries, because a run evicts
// and rebuilds far more often than it asks for the cost of the storages
// around those changes (the default sweep took about 11 s with it, 1.7 s
// with walks). The candidate index asks for few costs: it stores keys built
// from bound, the storage's own compute, and needs the true cost only of
// the storage it is about to choose (0.2 s). A walk visits each storage
// once, remembered in a dense per-storage stamp slice, and reuses one stack,
// so it allocates nothing in steady state.
//
// Costs only rise when a storage is evicted or an op is recorded, so those
// need no notice (the candidate index keeps lower bounds). They fall when an
// evicted storage comes back or is released: the material storages whose
// regions held it are those reached from it through evicted storages
// (downwards for ancestor regions, upwards for descendant regions). The
// tracker does not look for them: it reports that some costs fell (fell),
// and the index resets the few keys it stored that could now overstate a
// cost, the true keys it computed for storages about to be chosen (every
// other stored key is built from bound, which no region changes). Walking
// to the storages instead, as this tracker once did, visits the rest of an
// evicted chain at every rebuild: quadratic in the ops of a step with long
// evicted chains (bench/results/engine-scale.md).
type regionTracker struct {
	g *rc.Graph
	// both counts the descendant region in the cost (e*).
	both    bool
	lowered func(rc.StorageID)
	fell    func()

	// seen[s] == walk when the current walk has reached s.
	seen []uint32
	walk uint32
	// stack is the walk's work list (reused between walks).
	stack []rc.StorageID
}

// newRegionTracker returns the tracker for e* (both) or for the
// ancestors-only costs.
func newRegionTracker(g *rc.Graph, both bool) *regionTracker {
	return &regionTracker{g: g, both: both, lowered: func(rc.StorageID) {}, fell: func() {}}
}

func (t *regionTracker) setLowered(lowered func(rc.StorageID), fell func()) {
	t.lowered, t.fell = lowered, fell
}

// cost returns s's compute plus that of its evicted region(s). A storage that
// is not material has no region: its cost is its own compute.
func (t *regionTracker) cost(s rc.StorageID) int64 {
	st := t.g.Storage(s)
	c := st.Compute
	if !isMaterial(st) {
		return c
	}
	c = satmath.AddInt64(c, t.regionCompute(s, false))
	if t.both {
		// A walk of its own: a view can close a cycle between storages,
		// and a storage in both regions counts in both.
		c = satmath.AddInt64(c, t.regionCompute(s, true))
	}
	return c
}

// bound returns s's own compute, a lower bound of its cost that needs no
// walk.
func (t *regionTracker) bound(s rc.StorageID) int64 { return t.g.Storage(s).Compute }

// begin starts a new walk: storages stamped by earlier walks count as not
// reached.
func (t *regionTracker) begin() {
	if n := t.g.NumStorages(); len(t.seen) < n {
		t.seen = append(t.seen, make([]uint32, n-len(t.seen))...)
	}
	t.walk++
	if t.walk == 0 {
		// the stamp wrapped around: forget every old stamp
		clear(t.seen)
		t.walk = 1
	}
}

// regionCompute walks from base through evicted storages only, following
// parents (or children when down is set), and returns the summed compute of
// the evicted storages it reaches, each once.
func (t *regionTracker) regionCompute(base rc.StorageID, down bool) int64 {
	t.begin()
	g, seen, w := t.g, t.seen, t.walk
	var c int64
	stack := append(t.stack[:0], base)
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		xs := g.Storage(x)
		next := xs.Parents
		if down {
			next = xs.Children
		}
		for _, u := range next {
			if seen[u] == w {
				continue
			}
			if us := g.Storage(u); isEvicted(us) {
				seen[u] = w
				c = satmath.AddInt64(c, us.Compute)
				stack = append(stack, u)
			}
		}
	}
	t.stack = stack
	return c
}

// added needs no work: the outputs are resident and so are the inputs, so no
// region changes.
func (t *regionTracker) added(rc.OpID) {}

// dropped needs no work: an eviction only grows the regions around it.
func (t *regionTracker) dropped(rc.StorageID) {}

// resident reports the storages that came back (their own cost changed) and
// that some material storages' costs fell (fell: those whose regions held
// them).
func (t *regionTracker) resident(ss []rc.StorageID) {
	for _, s := range ss {
		t.lowered(s)
	}
	if len(ss) > 0 {
		t.fell()
	}
}

// released reports, when s was evicted, that the material storages whose
// regions held it got cheaper (fell). A material storage sits in no region
// (it only ends walks, as a released one does), so its release changes no
// cost.
func (t *regionTracker) released(s rc.StorageID, prev rc.State) {
	if prev != rc.Evicted {
		return
	}
	t.fell()
}

var _ tracker = (*regionTracker)(nil)
