package evict

import (
	"testing"

	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stressVictims calls Evict with extra until it writes less than a full
// out, two victims at a time, and returns the victims' tensors.
func stressVictims(t *testing.T, e *Engine, extra uint64) []rc.TensorID {
	t.Helper()
	var ids []rc.TensorID
	for _, v := range evictAll(t, e, extra) {
		ids = append(ids, v.Tensor)
	}
	return ids
}

func TestStressEvictsEveryCandidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		// setup registers tensors and runs ops on e; it returns the
		// tensors whose storages the next Evict must evict, in order.
		setup func(t *testing.T, e *Engine) []rc.TensorID
	}{
		{"chain, no budget", Config{Stress: true}, func(t *testing.T, e *Engine) []rc.TensorID {
			x := e.NewTensor(100, true)
			return chain(t, e, x, 3, 100)
		}},
		{"the budget and extra are ignored", Config{Stress: true, Budget: 1 << 40}, func(t *testing.T, e *Engine) []rc.TensorID {
			x := e.NewTensor(100, true)
			return chain(t, e, x, 2, 100)
		}},
		{"locked, pinned and small storages stay", Config{Stress: true, EvicteeMinSize: 50}, func(t *testing.T, e *Engine) []rc.TensorID {
			x := e.NewTensor(100, true)
			_, ys, err := e.Call("f", []rc.TensorID{x}, []Output{{Size: 100, Alias: -1}, {Size: 10, Alias: -1},
				{Size: 100, Alias: -1}, {Size: 100, Alias: -1}}, 10, 0)
			require.NoError(t, err)
			require.NoError(t, e.Lock(ys[2]))
			require.NoError(t, e.Pin(ys[3]))
			return []rc.TensorID{ys[0]}
		}},
		{"an unpinned external tensor is swapped", Config{Stress: true, SwapBandwidth: 1e9}, func(t *testing.T, e *Engine) []rc.TensorID {
			x := e.NewTensor(100, false)
			return []rc.TensorID{x}
		}},
		{"an unpinned external tensor without swapping stays", Config{Stress: true}, func(t *testing.T, e *Engine) []rc.TensorID {
			e.NewTensor(100, false)
			return nil
		}},
		{"released storages are handed out first", Config{Stress: true}, func(t *testing.T, e *Engine) []rc.TensorID {
			x := e.NewTensor(100, true)
			ts := chain(t, e, x, 3, 100)
			require.NoError(t, e.Release(ts[2])) // banished: pending
			return []rc.TensorID{ts[2], ts[0], ts[1]}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, tc.cfg)
			want := tc.setup(t, e)
			got := stressVictims(t, e, 1<<50)
			assert.Equal(t, want, got)
			for _, id := range want {
				assert.False(t, e.Graph().IsResident(id), "tensor %d", id)
			}
			assert.Empty(t, stressVictims(t, e, 0), "nothing left to evict")
			assert.Zero(t, e.Stats().Budget, "a stress engine reports no budget")
		})
	}
}

func TestStressEvictsRebuiltStoragesOnce(t *testing.T) {
	e := newEngine(t, Config{Stress: true, SwapBandwidth: 1e3})
	x := e.NewTensor(100, true)
	p := e.NewTensor(1000, false) // not recomputable: swapped
	ts := chain(t, e, x, 3, 100)
	require.ElementsMatch(t, []rc.TensorID{p, ts[0], ts[1], ts[2]}, stressVictims(t, e, 0))

	// ts[1] is rebuilt (re-running ts[0] first), p swapped back in
	steps, err := e.Plan(ts[1], nil)
	require.NoError(t, err)
	require.Len(t, steps, 2)
	require.NoError(t, e.HoldPlan(steps))
	for _, st := range steps {
		require.NoError(t, e.Rematerialized(st.Op, -1))
	}
	require.NoError(t, e.SwappedIn(p))
	for _, id := range []rc.TensorID{ts[0], ts[1], p} {
		require.True(t, e.Graph().IsResident(id))
	}
	assert.Empty(t, stressVictims(t, e, 0), "rebuilt storages are not evicted again by stress")
	assert.Positive(t, e.Candidates(), "they are still candidates")

	// a new op's output goes; Reclaim can still take the rebuilt ones
	ys := chain(t, e, ts[1], 1, 100)
	assert.Equal(t, ys, stressVictims(t, e, 0))
	var buf [8]Victim
	n, err := e.Reclaim(1<<20, buf[:])
	require.NoError(t, err)
	assert.Equal(t, 3, n, "ts[0], ts[1] and p")
	st := e.Stats()
	assert.Equal(t, int64(2), st.Rematerializations)
	assert.Equal(t, int64(1), st.SwapsIn)
}

// TestStressKeepsLineageWithoutBudget: with no budget a released storage
// is normally detached (its dependents lose their lineage); stress needs
// the lineage, so released storages are evicted and banished as with a
// budget.
func TestStressKeepsLineageWithoutBudget(t *testing.T) {
	for _, stress := range []bool{false, true} {
		e := newEngine(t, Config{Stress: stress})
		x := e.NewTensor(100, true)
		ts := chain(t, e, x, 2, 100)
		require.NoError(t, e.Release(ts[0]))
		s1 := e.Graph().StorageOf(ts[1])
		assert.Equal(t, !stress, s1.NoRecompute, "stress %v", stress)
		if stress {
			assert.Equal(t, rc.Evicted, e.Graph().StorageOf(ts[0]).State, "eager eviction: ts[1] may need it")
			evictAll(t, e, 0)
			steps, err := e.Plan(ts[1], nil)
			require.NoError(t, err)
			assert.Len(t, steps, 2, "ts[1] is rebuilt from x through ts[0]")
		}
	}
}

// TestStressTrainStep runs a training step with stress on, evicting before
// every op as the C ABI's caller does: it runs, every storage stress evicts
// goes once, and the re-runs stay within the number of ops.
func TestStressTrainStep(t *testing.T) {
	for _, depth := range []int{4, 32} {
		evicted := map[rc.TensorID]int{}
		e := newEngine(t, Config{Stress: true, OnEvict: func(v Victim, why EvictReason) {
			if why == ReasonBudget {
				evicted[v.Tensor]++
			}
		}})
		d := &abiDriver{t: t, e: e}
		require.NoError(t, trainStep(t, d, depth, 1000))
		st := e.Stats()
		ops := int64(e.Graph().NumOps())
		t.Logf("depth %d: %d ops, %d evictions, %d rematerializations", depth, ops, st.Evictions, st.Rematerializations)
		assert.Positive(t, st.Rematerializations)
		assert.LessOrEqual(t, st.Rematerializations, ops, "each storage is rebuilt at most once")
		for id, n := range evicted {
			assert.Equal(t, 1, n, "tensor %d evicted by stress more than once", id)
		}
		assert.Zero(t, e.PlanHolds())
	}
}

// TestStressEvictWithNothingAllocates: the budget loop runs after every op;
// with nothing to evict it neither allocates nor picks.
func TestStressEvictWithNothingAllocates(t *testing.T) {
	e := newEngine(t, Config{Stress: true})
	x := e.NewTensor(100, true)
	chain(t, e, x, 3, 100)
	evictAll(t, e, 0)
	var buf [4]Victim
	searches := e.Stats().VictimSearches
	allocs := testing.AllocsPerRun(100, func() {
		n, err := e.Evict(0, buf[:])
		if n != 0 || err != nil {
			t.Fatalf("Evict = %d, %v", n, err)
		}
	})
	assert.Zero(t, allocs)
	assert.Equal(t, searches, e.Stats().VictimSearches, "stress does not search for victims")
}

func TestDecodeStress(t *testing.T) {
	envMinSize := Defaults{Config: Config{EvicteeMinSize: 4096}, EvicteeMinSizeSet: true}
	envAuto := Defaults{Config: Config{Heuristic: Auto}, HeuristicSet: true}
	tests := []struct {
		name      string
		defaults  Defaults
		in        string
		stress    bool
		heuristic Heuristic
		minSize   uint64
		err       string
	}{
		{"off", Defaults{}, `{}`, false, Default, 0, ""},
		{"on", Defaults{}, `{"stress": true}`, true, Default, 0, ""},
		{"region: no minimum size", Defaults{}, `{"stress": true, "defaults": "region"}`, true, Default, 0, ""},
		{"region with a budget: no tuning", Defaults{}, `{"stress": true, "defaults": "region", "budget": 1000}`, true, Default, 0, ""},
		{"region, environment's auto: no tuning", envAuto, `{"stress": true, "defaults": "region", "budget": 1000}`, true, Default, 0, ""},
		{"region, environment's minimum size", envMinSize, `{"stress": true, "defaults": "region"}`, true, Default, 4096, ""},
		{"region, caller's minimum size", Defaults{}, `{"stress": true, "defaults": "region", "evictee_min_size": 8}`, true, Default, 8, ""},
		{"region, stress off", Defaults{}, `{"stress": false, "defaults": "region"}`, false, Default, RegionEvicteeMinSize, ""},
		{"not a bool", Defaults{}, `{"stress": 1}`, false, 0, 0, "dtr config: stress 1: want true or false"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := tc.defaults.Decode([]byte(tc.in))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.stress, cfg.Stress)
			assert.Equal(t, tc.heuristic, cfg.Heuristic)
			assert.Equal(t, tc.minSize, cfg.EvicteeMinSize)
			assert.Equal(t, tc.stress, cfg.JSON(UsageSource{})["stress"])
		})
	}
}
