package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/device"
)

// churnAtBudget holds about budget bytes live and replaces one block at a
// time by one of another size, as a DTR engine at its budget does: the
// freed block never fits the next request, so every request misses the
// cache. It returns the allocator's statistics at the end.
func churnAtBudget(t *testing.T, a *Allocator, budget uint64) Stats {
	t.Helper()
	var live liveAtBudget
	for i := 0; i < 400; i++ {
		size := uint64(20+(i*37)%60) << 20
		live.alloc(t, a, budget, size, size, func(n int) int { return (i * 7) % n })
	}
	require.NoError(t, a.checkInvariants())
	freeAll(t, a, live.ptrs)
	return a.Stats()
}

// TestBudgetBoundsCache: under a known DTR budget the cache may grow to the
// budget plus BudgetSlack of it before granules are remapped, never past the
// limit; without a budget (or with BudgetSlack < 0) the bound is CacheSlack's.
func TestBudgetBoundsCache(t *testing.T) {
	const budget = 1 << 30
	for _, tc := range []struct {
		name        string
		cfg         Config
		setBudget   uint64
		threshold   uint64
		maxReserved uint64 // peak reserved allowed
		fewerRemaps bool   // remaps below the no-budget run's
	}{
		{name: "no budget", cfg: Config{}, maxReserved: budget + 100<<20},
		{name: "budget in config", cfg: Config{Budget: budget}, maxReserved: budget + budget/10, fewerRemaps: true},
		{name: "SetBudget", setBudget: budget, maxReserved: budget + budget/10, fewerRemaps: true},
		{name: "threshold stands for the budget", threshold: budget, maxReserved: budget + budget/10, fewerRemaps: true},
		{name: "slack 0.5", cfg: Config{Budget: budget, BudgetSlack: 0.5}, maxReserved: budget + budget/2, fewerRemaps: true},
		{name: "budget ignored", cfg: Config{Budget: budget, BudgetSlack: -1}, maxReserved: budget + 100<<20},
		{name: "limit caps the bound", cfg: Config{Budget: budget, BudgetSlack: 0.5, Limit: budget + 64<<20}, maxReserved: budget + 64<<20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, _ := newTestAllocator(t, Config{})
			ref := churnAtBudget(t, base, budget)
			require.Positive(t, ref["num_remap"], "the churn remaps without a budget")

			a, _ := newTestAllocator(t, tc.cfg)
			if tc.setBudget > 0 {
				a.SetBudget(tc.setBudget)
			}
			if tc.threshold > 0 {
				a.SetEvictionThreshold(tc.threshold)
			}
			st := churnAtBudget(t, a, budget)
			require.LessOrEqual(t, uint64(st["reserved_bytes.all.peak"]), uint64(tc.maxReserved))
			if tc.fewerRemaps {
				require.Less(t, st["num_remap"], ref["num_remap"]/2, "the budget's slack spares remaps")
				require.Equal(t, int64(budget), st["budget_bytes"])
			}
			require.GreaterOrEqual(t, st["num_map"], st["num_remap"])
			require.Positive(t, st["num_map_calls"])
			require.LessOrEqual(t, st["num_map_calls"], st["num_map"])
		})
	}
}

// TestGrowWindowSpansHoles: a growth maps only the unmapped granules of the
// window it uses, which may span cached free blocks and several unmapped
// holes of a segment.
func TestGrowWindowSpansHoles(t *testing.T) {
	const mib = 1 << 20
	a, d := newTestAllocator(t, Config{Limit: 64 * mib, CacheSlack: -1})
	// Seven 8 MiB blocks tile the first 56 MiB of one segment.
	var ps []device.Ptr
	for i := 0; i < 7; i++ {
		p, err := a.Malloc(8*mib, 1)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for i := 1; i < 7; i++ {
		require.Equal(t, ps[0]+device.Ptr(i*8*mib), ps[i], "blocks tile the segment")
	}
	// Blocks 2 and 4 are freed and their granules released (holes); then
	// blocks 1 and 3 are freed: free, hole, free, hole from block 1 to 5.
	hole := func(p device.Ptr) {
		require.NoError(t, a.Free(p))
		a.mu.Lock()
		defer a.mu.Unlock()
		a.flushQuick()
		b := a.blocks[p]
		require.NotNil(t, b)
		hs, err := a.unmapFree(b, 4, a.handles[:0], false)
		require.NoError(t, err)
		a.releaseHandles(hs)
		a.handles = hs[:0]
		a.publish()
	}
	hole(ps[2])
	hole(ps[4])
	require.NoError(t, a.Free(ps[1]))
	require.NoError(t, a.Free(ps[3]))
	require.NoError(t, a.checkInvariants())
	before := a.Stats()
	require.Equal(t, int64(40*mib), before["mapped_bytes"])
	// 30 MiB fits from block 1 with the holes' granules mapped: 7 new
	// granules in two map calls. Growing elsewhere would need 15, more than
	// the limit leaves.
	p, err := a.Malloc(30*mib, 1)
	require.NoError(t, err)
	require.Equal(t, ps[1], p, "the window starts at the free block")
	st := a.Stats()
	require.Equal(t, int64(7), st["num_map"]-before["num_map"], "only the holes' granules are mapped")
	require.Equal(t, int64(2), st["num_map_calls"]-before["num_map_calls"], "one map call per hole")
	require.Zero(t, st["num_remap"])
	require.NoError(t, a.checkInvariants())
	require.LessOrEqual(t, d.Mapped(), uint64(64*mib))
	require.NoError(t, a.Free(p))
	for _, q := range []device.Ptr{ps[0], ps[5], ps[6]} {
		require.NoError(t, a.Free(q))
	}
}
