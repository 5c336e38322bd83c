package evict

import (
	"math"
	"testing"

	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/require"
)

// FuzzEngineEdges drives an engine on the candidate index and one on the
// exact scan with the same program, at any heuristic, recomp factors (NaN,
// infinities and exponents past MaxRecompFactor are set past validation, as
// issue 32 reported them reaching the engine), op costs (up to 2^63-1),
// sizes (up to 2^64-1: above rc.MaxSize they are refused) and budget. Every
// call must return (no spin), both engines must agree on every error and
// victim, a successful eviction must leave usage within the budget unless
// no candidate is left, and no victim may score NaN.
func FuzzEngineEdges(f *testing.F) {
	f.Add(uint8(AncSqrt), 1.0, 1.0, int64(math.MaxInt64), uint64(1<<20), uint64(3<<20), []byte{0, 1, 1, 1, 3, 2, 1, 3})
	f.Add(uint8(DTR), math.NaN(), math.NaN(), int64(math.MaxInt64-1), uint64(1<<48), uint64(1<<50), []byte{0, 1, 5, 9, 13, 3, 2, 6, 3})
	f.Add(uint8(MSPS), 110.0, 110.0, int64(math.MaxInt64/2), uint64(rc.MaxSize), uint64(math.MaxUint64), []byte{0, 1, 1, 3, 7, 11})
	f.Add(uint8(DTREq), math.Inf(1), 0.0, int64(1), uint64(math.MaxUint64), uint64(1), []byte{0, 4, 8, 1, 3})
	f.Add(uint8(Size), 0.5, math.Inf(-1), int64(-1), uint64(0), uint64(0), []byte{0, 0, 1, 1, 2, 3, 3})
	f.Fuzz(func(t *testing.T, h uint8, tf, mf float64, cost int64, size, budget uint64, prog []byte) {
		hs := Heuristics()
		var es [2]*Engine
		for i, exact := range []bool{false, true} {
			cfg := Config{Heuristic: hs[int(h)%len(hs)], ExactScan: exact, RecompTimeFactor: tf, RecompMemoryFactor: mf}
			e, err := New(cfg)
			if err != nil {
				cfg.RecompTimeFactor, cfg.RecompMemoryFactor = 0, 0
				e, err = New(cfg)
				require.NoError(t, err)
				// past validate, where not negative: what issue 32 saw
				if !(tf < 0) {
					e.tf = tf
				}
				if !(mf < 0) {
					e.mf = mf
				}
			}
			e.SetBudget(max(budget, 1))
			es[i] = e
		}
		var live []rc.TensorID
		if len(prog) > 64 {
			prog = prog[:64]
		}
		for _, b := range prog {
			sz := size >> (b / 4 % 8)
			c := cost >> (b / 32)
			var errs [2]error
			switch b % 4 {
			case 0: // a new tensor
				var ids [2]rc.TensorID
				for i, e := range es {
					ids[i], errs[i] = e.AddTensor(sz, b&16 != 0)
				}
				require.Equal(t, errs[0] == nil, errs[1] == nil, "AddTensor(%d): %v / %v", sz, errs[0], errs[1])
				require.Equal(t, ids[0], ids[1])
				if errs[0] == nil {
					live = append(live, ids[0])
				}
			case 1: // an op on the newest resident tensor
				if len(live) == 0 || !es[0].Graph().IsResident(live[len(live)-1]) {
					continue
				}
				in := live[len(live)-1]
				var ids [2][]rc.TensorID
				for i, e := range es {
					_, ids[i], errs[i] = e.Call("f", []rc.TensorID{in}, []Output{{Size: sz, Alias: -1}}, c, 0)
				}
				require.Equal(t, errs[0] == nil, errs[1] == nil, "Call(cost %d, size %d): %v / %v", c, sz, errs[0], errs[1])
				require.Equal(t, ids[0], ids[1])
				live = append(live, ids[0]...)
			case 2: // release one
				if len(live) == 0 {
					continue
				}
				j := int(b/4) % len(live)
				for i, e := range es {
					errs[i] = e.Release(live[j])
				}
				require.Equal(t, errs[0] == nil, errs[1] == nil)
				live = append(live[:j], live[j+1:]...)
			default: // evict down to the budget
				var vs [2][8]Victim
				var ns [2]int
				for i, e := range es {
					ns[i], errs[i] = e.Evict(uint64(b/4), vs[i][:])
				}
				require.Equal(t, errs[0] == nil, errs[1] == nil, "Evict: %v / %v", errs[0], errs[1])
				require.Equal(t, ns[0], ns[1])
				require.Equal(t, vs[0][:max(ns[0], 0)], vs[1][:max(ns[1], 0)], "index and exact scan choose the same victims")
				if errs[0] == nil && ns[0] < len(vs[0]) && es[0].Stats().Usage+uint64(b/4) > max(budget, 1) {
					require.Zero(t, es[0].sel.len(), "over the budget after Evict, only when nothing is left to evict")
				}
				for _, v := range vs[0][:max(ns[0], 0)] {
					if s, err := es[0].Score(v.Tensor); err == nil {
						require.False(t, math.IsNaN(s), "victim %d scores NaN", v.Tensor)
					}
				}
			}
		}
	})
}

// TestFlipTimeNearSaturatedClock checks the kinetic index's melt times when
// the clock is past half the int64 range (costs near 2^63 saturate it): a
// flip between two numerators there is found, not reported as never (which
// left the index with a stale winner: FuzzEngineEdges found it).
func TestFlipTimeNearSaturatedClock(t *testing.T) {
	x := key{a: 2.586636274951944e+15, l: 3458764513820540878, seq: 2}
	y := key{a: 2.586638741762878e+15, l: 4611686018427387837, seq: 3}
	for _, now := range []int64{4611686018427387838, 6917529027641081755, math.MaxInt64 - 3} {
		cur := before(x, y, now, true)
		ft := flipTime(x, y, now, cur)
		if ft == never {
			// no flip before the last clock
			require.Equal(t, cur, before(x, y, never-1, true), "now %d", now)
			continue
		}
		require.Greater(t, ft, now)
		require.NotEqual(t, cur, before(x, y, ft, true), "now %d: outcome at the melt time", now)
		require.Equal(t, cur, before(x, y, ft-1, true), "now %d: outcome just before it", now)
	}
	// one that does flip late: y (larger numerator, staler) goes first
	// until x's staleness catches up
	x2 := key{a: 1e15, l: 1 << 62, seq: 1}
	y2 := key{a: 2.04e15, l: 0, seq: 2} // flips at about 9.05e18, past the estimate's range
	now := int64(1<<62) + 10
	cur := before(x2, y2, now, true)
	require.False(t, cur, "y goes first while x is fresh")
	ft := flipTime(x2, y2, now, cur)
	require.Less(t, ft, int64(never))
	require.True(t, before(x2, y2, ft, true))
	require.False(t, before(x2, y2, ft-1, true))
}
