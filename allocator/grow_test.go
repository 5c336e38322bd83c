package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/device"
)

// growLayout lays out one large-pool segment of stream 1, block by block
// from its base (sizes in granules of the fake device): each block is
// allocated, then the holes are freed and emptied (unmapped), then the free
// blocks freed; the live ones stay. It returns the blocks' addresses.
func growLayout(t *testing.T, a *Allocator, blocks []layoutBlock) []device.Ptr {
	t.Helper()
	const g = 2 << 20
	ptrs := make([]device.Ptr, len(blocks))
	for i, b := range blocks {
		p, err := a.Malloc(b.n*g, 1)
		require.NoError(t, err)
		if i > 0 {
			require.Equal(t, ptrs[i-1]+device.Ptr(blocks[i-1].n*g), p, "block %d is laid out after block %d", i, i-1)
		}
		ptrs[i] = p
	}
	for i, b := range blocks {
		if b.kind == 'H' {
			require.NoError(t, a.Free(ptrs[i]))
		}
	}
	require.NoError(t, a.EmptyCache())
	for i, b := range blocks {
		if b.kind == 'F' {
			require.NoError(t, a.Free(ptrs[i]))
		}
	}
	return ptrs
}

// layoutBlock is n granules: 'L' live, 'F' free (cached), 'H' a hole
// (unmapped).
type layoutBlock struct {
	kind byte
	n    uint64
}

// TestGrowthStealsOutsideItsWindow is issue 32's soak seed 1380 (fake-vmm,
// 7.6 million operations) made small: a growth whose window cuts a free
// run, or borders one, lacks granules that only that run holds outside the
// window. The steal left every free block touching the window alone, so the
// request failed with the granules that live blocks touch plus its own
// within the limit (a spurious out-of-memory, what the model checks).
func TestGrowthStealsOutsideItsWindow(t *testing.T) {
	const g = 2 << 20
	for _, tc := range []struct {
		name   string
		layout []layoutBlock
		req    uint64 // granules
	}{
		// Window [0, 8): F1 and 2 granules of F2 around the hole; F2's top
		// 2 granules are outside it and are what the growth lacks.
		{"free run straddles the window", []layoutBlock{{'F', 4}, {'H', 2}, {'F', 4}, {'L', 1}}, 8},
		// Window [0, 5): F0 and 4 of the hole's 5 granules; F2 borders the
		// hole (unmapped, it merges with it).
		{"free block borders the hole", []layoutBlock{{'F', 1}, {'H', 5}, {'F', 1}, {'L', 1}}, 5},
		// Both: F2 straddles the window's end and a second hole lies
		// beyond it.
		{"free run between two holes", []layoutBlock{{'L', 1}, {'F', 3}, {'H', 3}, {'F', 6}, {'H', 2}, {'L', 1}}, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, d := newTestAllocator(t, Config{})
			growLayout(t, a, tc.layout)
			var live uint64
			for _, b := range tc.layout {
				if b.kind == 'L' {
					live += b.n
				}
			}
			// The limit holds exactly the live granules and the request's.
			limit := (live + tc.req) * g
			require.LessOrEqual(t, d.Mapped(), limit)
			require.NoError(t, a.SetLimit(limit))
			p, err := a.Malloc(tc.req*g, 1)
			require.NoError(t, err, "%d live granules + %d requested fit the limit of %d", live, tc.req, limit/g)
			require.LessOrEqual(t, d.Mapped(), limit)
			require.NoError(t, a.checkInvariants())
			require.NoError(t, a.Free(p))
			require.NoError(t, a.checkInvariants())
		})
	}
}

// TestGrowthStealNextToItsHole: a window that starts at an unmapped block
// (a step plan's window is fixed; best fit's never starts there) with a free
// block before it: the granules stolen from that block merge with the hole
// the growth maps, which must be found again under its new start.
func TestGrowthStealNextToItsHole(t *testing.T) {
	const g = 2 << 20
	a, d := newTestAllocator(t, Config{})
	ptrs := growLayout(t, a, []layoutBlock{{'F', 2}, {'H', 2}, {'F', 2}, {'L', 1}})
	// Live 1 + window 4 (2 holes) = limit: the 2 granules come from the
	// free block before the hole, outside the window.
	require.NoError(t, a.SetLimit(5*g))
	lo, r := ptrs[1], uint64(4*g)

	m := func() *block {
		a.mu.Lock()
		defer a.mu.Unlock()
		return growAt(t, a, lo, r)
	}()
	require.LessOrEqual(t, m.addr, lo)
	require.GreaterOrEqual(t, m.end(), lo+device.Ptr(r))
	require.Equal(t, uint64(5*g), d.Mapped())
	require.NoError(t, a.checkInvariants())
}

// growAt maps what is unmapped of the window [lo, lo+r), as a step plan's
// growth does (takeRange), and returns the free block covering it, cached.
func growAt(t *testing.T, a *Allocator, lo device.Ptr, r uint64) *block {
	a.flushQuick()
	seg := a.segmentOf(lo)
	var first, stop *block
	for b := seg.head; b != nil; b = b.next {
		if first == nil && b.end() > lo {
			first = b
		}
		if b.addr >= lo+device.Ptr(r) {
			stop = b
			break
		}
	}
	plan := growPlan{seg: seg, lo: lo, hi: lo + device.Ptr(r), k: a.windowGranules(first, stop, lo, lo+device.Ptr(r))}
	g := device.Ptr(a.gran)
	for b := first; b != stop; b = b.next {
		if b.state == stateUnmapped {
			m0 := max(b.addr, seg.base+(plan.lo-seg.base)/g*g)
			m1 := min(b.end(), seg.base+(plan.hi-seg.base+g-1)/g*g)
			plan.ranges = append(plan.ranges, growRange{u: b, m0: m0, m1: m1})
		}
	}
	require.Equal(t, 2, plan.k, "the window holds 2 unmapped granules")
	hs, err := a.obtainGranules(plan.k, r, &plan)
	require.NoError(t, err)
	m, err := a.mapInto(&plan, hs)
	require.NoError(t, err)
	a.addFree(m)
	return m
}
