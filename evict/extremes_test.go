package evict

import (
	"errors"
	"math"
	"testing"

	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The engine at the edges of its arithmetic (issue 32): costs and clocks at
// the int64 limit, sizes at and above rc.MaxSize, exponents that would
// overflow a score, and numerators that are not finite. Every case must
// terminate (a hang shows as the test binary's -timeout), keep the counters
// non-negative and choose the victims the exact scan chooses.

// edgeFloats are numerators at and beyond the edges of float64.
var edgeFloats = []float64{0, math.SmallestNonzeroFloat64, 1e-300, 0.5, 1, 3, 1e300, math.MaxFloat64,
	math.Inf(1), math.NaN(), -1, math.Inf(-1)}

// edgeStaleness are stalenesses at the edges of the clock.
var edgeStaleness = []uint64{0, 1, 2, 1 << 53, math.MaxInt64 - 1, math.MaxInt64}

func TestCmpScoreIsATotalPreorder(t *testing.T) {
	type v struct {
		a float64
		d uint64
	}
	var vs []v
	for _, a := range edgeFloats {
		for _, d := range edgeStaleness {
			vs = append(vs, v{a, d})
		}
	}
	cmp := func(x, y v) int { return cmpScore(x.a, x.d, y.a, y.d) }
	for _, x := range vs {
		require.Equal(t, 0, cmp(x, x), "reflexive: %v", x)
		for _, y := range vs {
			require.Equal(t, -cmp(y, x), cmp(x, y), "antisymmetric: %v %v", x, y)
			for _, z := range vs {
				if cmp(x, y) <= 0 && cmp(y, z) <= 0 {
					require.LessOrEqual(t, cmp(x, z), 0, "transitive: %v <= %v <= %v", x, y, z)
				}
			}
		}
	}
	for _, x := range edgeFloats {
		require.Equal(t, 0, cmpFloat(x, x), "reflexive: %v", x)
		require.True(t, sameNumerator(x, x), "a numerator is itself: %v", x)
		for _, y := range edgeFloats {
			require.Equal(t, -cmpFloat(y, x), cmpFloat(x, y), "%v %v", x, y)
		}
	}
	// the finite order is kept
	assert.Equal(t, -1, cmpScore(1, 2, 1, 1), "1/2 < 1/1")
	assert.Equal(t, -1, cmpScore(math.MaxFloat64, 1, math.Inf(1), 1), "finite < +Inf")
	assert.Equal(t, -1, cmpScore(math.Inf(1), 1, 0, 0), "+Inf/d < a/0")
}

func TestNumeratorNeverNaN(t *testing.T) {
	costs := []int64{0, 1, 1000, 1 << 53, math.MaxInt64}
	sizes := []uint64{0, 1, 512, 1 << 30, rc.MaxSize, math.MaxUint64}
	factors := []float64{0, 0.25, 1, 2, MaxRecompFactor, 110, 1e308}
	for _, c := range costs {
		for _, m := range sizes {
			for _, tf := range factors {
				for _, mf := range factors {
					a := numerator(c, tf, m, mf)
					require.False(t, math.IsNaN(a), "numerator(%d, %v, %d, %v)", c, tf, m, mf)
					require.GreaterOrEqual(t, a, 0.0, "numerator(%d, %v, %d, %v)", c, tf, m, mf)
					if tf <= MaxRecompFactor && mf <= MaxRecompFactor && m > 0 && m <= rc.MaxSize && c > 0 {
						sq := a * a
						require.False(t, math.IsInf(sq, 0) || sq == 0, "anc-sqrt's square of numerator(%d, %v, %d, %v) = %v", c, tf, m, mf, a)
					}
				}
			}
		}
	}
	assert.Equal(t, math.Inf(1), numerator(5, 1, 0, 1), "a zero size frees nothing: last")
	assert.Equal(t, 0.0, numerator(0, 1, 10, 1))
	assert.Equal(t, 0.5, numerator(5, 1, 10, 1))
}

// edgeChain registers an external tensor and a chain of n ops of the given
// cost and output size under cfg, and returns the engine. set, when not nil,
// changes the engine before anything is registered.
func edgeChain(t *testing.T, cfg Config, set func(*Engine), n int, cost int64, size uint64) *Engine {
	t.Helper()
	e := newEngine(t, cfg)
	if set != nil {
		set(e)
	}
	prev, err := e.AddTensor(size, true)
	require.NoError(t, err)
	for range n {
		require.NoError(t, e.Access(prev))
		_, ids, err := e.Call("f", []rc.TensorID{prev}, []Output{{Size: size, Alias: -1}}, cost, 0)
		require.NoError(t, err)
		prev = ids[0]
	}
	return e
}

func TestVictimSearchTerminatesAtTheEdges(t *testing.T) {
	type factors struct{ tf, mf float64 }
	for _, h := range Heuristics() {
		for _, f := range []factors{{1, 1}, {MaxRecompFactor, MaxRecompFactor}, {0.5, 2}, {110, 110}} {
			for _, cost := range []int64{1000, math.MaxInt64 / 2, math.MaxInt64} {
				for _, size := range []uint64{1 << 20, rc.MaxSize} {
					var victims [2][]rc.TensorID
					for i, exact := range []bool{false, true} {
						cfg := Config{Heuristic: h, ExactScan: exact}
						if f.tf <= MaxRecompFactor {
							cfg.RecompTimeFactor, cfg.RecompMemoryFactor = f.tf, f.mf
						}
						var set func(*Engine)
						if f.tf > MaxRecompFactor {
							// past validate: the exponents issue 32
							// reported spinning (scores Inf/Inf = NaN)
							set = func(e *Engine) { e.tf, e.mf = f.tf, f.mf }
						}
						e := edgeChain(t, cfg, set, 8, cost, size)
						e.SetBudget(3 * size)
						vs := evictAll(t, e, 0)
						st := e.Stats()
						require.LessOrEqual(t, st.Usage, 3*size, "%v %+v cost %d size %d", h, f, cost, size)
						require.GreaterOrEqual(t, st.BaseCostNS, int64(0))
						require.GreaterOrEqual(t, st.Clock, int64(1))
						for _, v := range vs {
							victims[i] = append(victims[i], v.Tensor)
							s, err := e.Score(v.Tensor)
							require.NoError(t, err)
							require.False(t, math.IsNaN(s), "score of victim %d", v.Tensor)
						}
					}
					require.Equal(t, victims[1], victims[0], "index and exact scan: %v %+v cost %d size %d", h, f, cost, size)
				}
			}
		}
	}
}

func TestCostsAndClockSaturate(t *testing.T) {
	for _, h := range Heuristics() {
		e := edgeChain(t, Config{Heuristic: h, Budget: 1 << 40}, nil, 4, math.MaxInt64, 100)
		st := e.Stats()
		assert.Equal(t, int64(math.MaxInt64), st.BaseCostNS, "%v: base cost saturates", h)
		assert.Equal(t, int64(math.MaxInt64), st.Clock, "%v: clock saturates", h)
		// drop the whole chain but the last output: every cost walk sums
		// MaxInt64s
		g := e.Graph()
		for s := 1; s < g.NumStorages()-1; s++ {
			if g.Storage(rc.StorageID(s)).State == rc.Resident {
				e.dropStorage(rc.StorageID(s))
			}
		}
		last := rc.StorageID(g.NumStorages() - 1)
		assert.Equal(t, int64(math.MaxInt64), e.tr.cost(last), "%v: neighbourhood cost saturates", h)
		for s := range g.NumStorages() {
			assert.GreaterOrEqual(t, e.tr.cost(rc.StorageID(s)), int64(0), "%v: storage %d", h, s)
		}
		// a re-run of a saturated cost stays saturated
		tgt := g.Storage(rc.StorageID(1)).Root
		plan, err := e.Plan(tgt, nil)
		require.NoError(t, err)
		for _, step := range plan {
			if step.Kind == rc.StepRerun {
				require.NoError(t, e.RematerializedFor(step.Op, tgt, -1))
			}
		}
		st = e.Stats()
		assert.Equal(t, int64(math.MaxInt64), st.RematCostNS, "%v", h)
		assert.Equal(t, int64(math.MaxInt64), st.Clock, "%v", h)
	}
}

func TestSwapTimeSaturates(t *testing.T) {
	e := newEngine(t, Config{SwapBandwidth: math.SmallestNonzeroFloat64})
	assert.Equal(t, int64(math.MaxInt64), e.transferNS(rc.MaxSize))
	assert.Equal(t, int64(0), e.transferNS(0))
}

func TestSizesAboveTheMaximumAreRefused(t *testing.T) {
	e := newEngine(t, Config{Budget: 1 << 30})
	for _, n := range []uint64{rc.MaxSize + 1, 1 << 62, math.MaxUint64} {
		_, err := e.AddTensor(n, false)
		require.Error(t, err)
		assert.True(t, errors.Is(err, rc.ErrTooLarge), "%v", err)
		assert.Contains(t, err.Error(), "size")
		assert.Contains(t, err.Error(), "281474976710656", "names the limit: %v", err)
	}
	x, err := e.AddTensor(100, true)
	require.NoError(t, err)
	_, _, err = e.Call("f", []rc.TensorID{x}, []Output{{Size: rc.MaxSize + 1, Alias: -1}}, 1, 0)
	require.ErrorIs(t, err, rc.ErrTooLarge)
	assert.Contains(t, err.Error(), "op f output 0")
	st := e.Stats()
	assert.Equal(t, uint64(100), st.Usage, "nothing refused was counted")
	assert.Equal(t, uint64(100), st.PeakUsage)
	assert.Equal(t, 1, st.Tensors)
}

func TestUsageNeverWraps(t *testing.T) {
	// issue 32: four tensors of 2^62 bytes left usage 0. Tensors of the
	// largest size fill the live-bytes limit exactly, then one more is
	// refused and usage and peak stay at the limit.
	e := newEngine(t, Config{Budget: 1 << 30})
	n := rc.MaxLiveBytes / rc.MaxSize
	for i := range n {
		_, err := e.AddTensor(rc.MaxSize, false)
		require.NoError(t, err, "tensor %d", i)
	}
	_, err := e.AddTensor(1, false)
	require.ErrorIs(t, err, rc.ErrTooLarge)
	assert.Contains(t, err.Error(), "live storages")
	st := e.Stats()
	assert.Equal(t, uint64(rc.MaxLiveBytes), st.Usage)
	assert.Equal(t, uint64(rc.MaxLiveBytes), st.PeakUsage)
	// nothing is recomputable or swappable: the budget loop fails cleanly,
	// naming a usage that did not wrap
	var buf [4]Victim
	_, err = e.Evict(0, buf[:])
	require.ErrorIs(t, err, ErrNoEvictable)
	assert.Contains(t, err.Error(), "4611686018427387904")
}

func TestRecompFactorsThatOverflowAreRefused(t *testing.T) {
	for _, c := range []struct {
		tf, mf float64
		ok     bool
	}{
		{0, 0, true}, {1, 1, true}, {MaxRecompFactor, MaxRecompFactor, true}, {0.01, 7.5, true},
		{MaxRecompFactor + 0.001, 1, false}, {1, 110, false}, {110, 110, false},
		{math.NaN(), 1, false}, {1, math.Inf(1), false}, {-1, 1, false},
	} {
		_, err := New(Config{RecompTimeFactor: c.tf, RecompMemoryFactor: c.mf})
		if c.ok {
			assert.NoError(t, err, "%v %v", c.tf, c.mf)
			continue
		}
		require.Error(t, err, "%v %v", c.tf, c.mf)
		assert.Contains(t, err.Error(), "from 0 (meaning 1) to 8")
	}
}
