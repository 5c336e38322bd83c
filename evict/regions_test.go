package evict

import (
	"fmt"
	"testing"

	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// closureCost is the definition the region tracker is checked against,
// written independently: the summed compute of the evicted storages reached
// from s through evicted storages only, following parents (or children when
// down is set), each counted once.
func closureCost(g *rc.Graph, s rc.StorageID, down bool) int64 {
	seen := map[rc.StorageID]bool{}
	var c int64
	var visit func(x rc.StorageID)
	visit = func(x rc.StorageID) {
		next := g.Storage(x).Parents
		if down {
			next = g.Storage(x).Children
		}
		for _, u := range next {
			if us := g.Storage(u); us.State == rc.Evicted && !seen[u] {
				seen[u] = true
				c += us.Compute
				visit(u)
			}
		}
	}
	visit(s)
	return c
}

// wantCost is the neighbourhood cost of heuristic h by definition: a
// material storage's compute plus its evicted ancestor closure (and, for
// h_DTR, its evicted descendant closure); a storage that is not material
// costs its own compute.
func wantCost(g *rc.Graph, h Heuristic, s rc.StorageID) int64 {
	st := g.Storage(s)
	if !isMaterial(st) {
		return st.Compute
	}
	c := st.Compute + closureCost(g, s, false)
	if h == DTR {
		c += closureCost(g, s, true)
	}
	return c
}

// checkEngine checks, after a step of a random history, that the tracker's
// cost of every storage is the definition (region heuristics) and bounded
// below by its bound, and that no key stored in the candidate index
// overstates the true one (the index's invariant: every fall of a score was
// reported), and that the soft-hold counts are those of the open plans.
func checkEngine(t *testing.T, e *Engine, what string) {
	t.Helper()
	g := e.Graph()
	for s := rc.StorageID(0); int(s) < g.NumStorages(); s++ {
		c := e.tr.cost(s)
		if _, ok := e.tr.(*regionTracker); ok {
			require.Equal(t, wantCost(g, e.h, s), c, "%s: cost of storage %d (%s)", what, s, g.Storage(s).State)
		}
		require.LessOrEqual(t, e.tr.bound(s), c, "%s: bound of storage %d", what, s)
	}
	checkSoftHolds(t, e, what)
	reg, later := e.PinnedBytes()
	_, pinned := scanPinned(e, nil)
	require.Equal(t, pinned, reg+later, "%s: pinned totals", what)
	z, ok := e.sel.(*lazySelector)
	require.True(t, ok)
	if z.index == nil {
		// Not built yet (no victim searched): the set holds exactly the
		// storages that may be evicted.
		for s := rc.StorageID(0); int(s) < g.NumStorages(); s++ {
			member := int(s) < len(z.set.pos) && z.set.pos[s] >= 0
			require.Equal(t, e.eligible(g.Storage(s)), member, "%s: storage %d in the unbuilt index's set", what, s)
		}
		return
	}
	x := z.index
	for s, sl := range x.slotOf {
		if sl < 0 {
			continue
		}
		stored, exact := x.keys[sl], e.key(rc.StorageID(s))
		require.False(t, stored.reserve && !exact.reserve, "%s: storage %d is an ordinary candidate but its stored key is a reserve one", what, s)
		if stored.reserve != exact.reserve {
			continue // reserve keys sort last: a stored ordinary key understates
		}
		require.LessOrEqual(t, stored.due, exact.due, "%s: storage %d: stored key has it read later than it is", what, s)
		if stored.due != exact.due {
			continue // a smaller due sorts first: the stored key understates
		}
		require.False(t, exact.dead && !stored.dead, "%s: storage %d is dead but its stored key is not", what, s)
		if stored.dead != exact.dead {
			continue // dead keys sort first: a stored dead key understates
		}
		require.LessOrEqual(t, stored.a, exact.a, "%s: storage %d: stored numerator overstates", what, s)
		if e.stale {
			require.LessOrEqual(t, stored.l, exact.l, "%s: storage %d: stored last access is later than the true one", what, s)
		}
	}
	// The tree, however it was updated, is the one built from scratch over
	// the stored keys at the clock it is valid at.
	fresh := &indexSelector{e: e, stale: x.stale, keys: x.keys, n: x.n, now: x.now,
		win: make([]int32, len(x.win)), melt: make([]int64, len(x.melt))}
	copy(fresh.win[x.n:], x.win[x.n:])
	copy(fresh.melt[x.n:], x.melt[x.n:])
	for i := x.n - 1; i >= 1; i-- {
		fresh.recompute(i)
	}
	require.Equal(t, fresh.win[1:], x.win[1:], "%s: tree winners", what)
	require.Equal(t, fresh.melt[1:x.n], x.melt[1:x.n], "%s: tree melt times", what)
}

// TestTrackerCostsAndIndexBounds runs random engine histories (ops, views
// that can close cycles between storages, releases, plans, swaps, every
// heuristic and both modes) and after every step checks the region costs
// against their definition and the index's stored keys against the true
// ones.
func TestTrackerCostsAndIndexBounds(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 12
	}
	checked := 0
	for seed := int64(1); seed <= int64(seeds); seed++ {
		for _, h := range Heuristics() {
			w := newTwin(t, seed)
			cfg := w.idx.cfg
			cfg.Heuristic = h
			if seed%3 == 0 {
				cfg.SwapBandwidth = 1e6
			}
			w.idx = must(New(cfg))
			cfg.ExactScan = true
			w.scan = must(New(cfg))
			for i := 0; i < 250; i++ {
				if !w.step() {
					if w.abandoned {
						checkEngine(t, w.idx, fmt.Sprintf("seed %d %s step %d, plans abandoned", seed, h, i))
					}
					break
				}
				checkEngine(t, w.idx, fmt.Sprintf("seed %d %s step %d", seed, h, i))
				checked++
			}
		}
	}
	t.Logf("%d engine states checked", checked)
}

// TestRegionCostThroughViewCycle builds a cycle between two storages (b is
// computed from a; then a view of a is taken with b as a second input, so b
// is also a parent of a) and checks that h_DTR counts an evicted storage
// that is both an ancestor and a descendant in both regions, as the
// definition does, and that MSPS counts it once.
func TestRegionCostThroughViewCycle(t *testing.T) {
	for _, tc := range []struct {
		h    Heuristic
		want int64
	}{
		{DTR, 10 + 2 + 20 + 20},
		{MSPS, 10 + 2 + 20},
		{AncSqrt, 10 + 2 + 20},
	} {
		t.Run(tc.h.String(), func(t *testing.T) {
			e := must(New(Config{Heuristic: tc.h}))
			x := e.NewTensor(100, true)
			_, a, err := e.Call("a", []rc.TensorID{x}, []Output{{Size: 100, Alias: -1}}, 10, 0)
			require.NoError(t, err)
			_, b, err := e.Call("b", a, []Output{{Size: 100, Alias: -1}}, 20, 0)
			require.NoError(t, err)
			_, _, err = e.Call("view", []rc.TensorID{a[0], b[0]}, []Output{{Alias: 0}}, 2, 0)
			require.NoError(t, err)
			g := e.Graph()
			sa, sb := g.Tensor(a[0]).Storage, g.Tensor(b[0]).Storage
			require.Contains(t, g.Storage(sa).Parents, sb, "the view makes b a parent of a")
			e.dropStorage(sb)
			assert.Equal(t, tc.want, e.tr.cost(sa))
			assert.Equal(t, wantCost(g, tc.h, sa), e.tr.cost(sa))
		})
	}
}

// TestRegionTrackerLowersOnReturn checks the notifications: when an evicted
// storage comes back it is reported itself (lowered) and the costs of the
// storages whose regions held it are said to have fallen (fell, once: the
// tracker does not walk to them); the release of an evicted storage reports
// a fall, that of a resident one nothing.
func TestRegionTrackerLowersOnReturn(t *testing.T) {
	for _, h := range []Heuristic{MSPS, DTR, AncSqrt} {
		t.Run(h.String(), func(t *testing.T) {
			// x -> a -> b -> c with b evicted; then b is re-run
			f := newFixture(t, h)
			names := map[rc.StorageID]string{f.sid(f.a): "a", f.sid(f.b): "b", f.sid(f.c): "c", f.sid(f.d): "d", f.sid(f.t): "t", f.sid(f.x): "x"}
			f.drop(f.b)
			var got []string
			falls := 0
			f.e.tr.setLowered(func(s rc.StorageID) { got = append(got, names[s]) }, func() { falls++ })
			steps, err := f.e.Plan(f.b, nil)
			require.NoError(t, err)
			require.Len(t, steps, 1)
			require.NoError(t, f.e.Rematerialized(steps[0].Op, -1))
			assert.Equal(t, []string{"b"}, got)
			assert.Equal(t, 1, falls)

			got, falls = nil, 0
			tr := f.e.tr
			tr.released(f.sid(f.c), rc.Resident)
			assert.Zero(t, falls, "a material storage sits in no region")
			tr.released(f.sid(f.c), rc.Evicted)
			assert.Equal(t, 1, falls)
			assert.Empty(t, got)
		})
	}
}

// TestRegionWalkStampWraps checks that the walk stamp wrapping around to zero
// forgets the old stamps instead of taking them for the current walk.
func TestRegionWalkStampWraps(t *testing.T) {
	f := newFixture(t, DTR)
	f.drop(f.a, f.c)
	tr, ok := f.e.tr.(*regionTracker)
	require.True(t, ok)
	want := wantCost(f.e.Graph(), DTR, f.sid(f.b))
	require.Equal(t, int64(20+10+40), want)
	tr.walk = ^uint32(0) - 1
	for i := 0; i < 4; i++ {
		assert.Equal(t, want, tr.cost(f.sid(f.b)), "walk stamp %d", tr.walk)
	}
	assert.Less(t, tr.walk, uint32(8), "the stamp wrapped")
}
