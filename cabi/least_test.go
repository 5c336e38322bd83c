package main

import (
	"encoding/json"
	"testing"

	"github.com/memscale/memscale/evict"
	rc "github.com/memscale/memscale/recompute"
	"github.com/memscale/memscale/replay"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTakeLeastKey(t *testing.T) {
	rest, want, err := takeLeastKey([]byte(`{"budget": 10, "least_budget": true}`))
	require.NoError(t, err)
	assert.True(t, want)
	var m map[string]any
	require.NoError(t, json.Unmarshal(rest, &m))
	assert.Equal(t, map[string]any{"budget": float64(10)}, m, "the rest is evict's")
	for _, in := range []string{`{"budget": 10}`, ``, `not json`, `{"least_budget": false}`} {
		_, want, err := takeLeastKey([]byte(in))
		require.NoError(t, err, in)
		assert.False(t, want, in)
	}
	_, _, err = takeLeastKey([]byte(`{"least_budget": 1}`))
	assert.ErrorContains(t, err, `"least_budget": 1 is not a bool`)
}

// TestLeastBudgetKey: an engine created with "least_budget": true records its
// program and, at finish, reports the least budget a replay of it ran at -
// here the chain's floor, a parameter and two links (100 + 2 x 1000 bytes).
func TestLeastBudgetKey(t *testing.T) {
	for _, tc := range []struct {
		config, ceiling string
		replays         int // an unbudgeted step's peak is no ceiling: a replay at the floor
	}{
		{`{"least_budget": true, "usage": "engine"}`, "unbudgeted: no ceiling", 1},
		{`{"least_budget": true, "usage": "engine", "budget": 1000000}`, "the budget it ran at", 1},
	} {
		h := abiDTRCreate(tc.config)
		require.Positive(t, h, lastError())
		runChain(t, h, 10)
		var before struct {
			Least *leastStats `json:"least_budget"`
		}
		require.NoError(t, json.Unmarshal([]byte(abiDTRStatsJSON(h)), &before))
		assert.Nil(t, before.Least, "searched at finish, not before")
		require.Equal(t, 0, abiDTRFinish(h), lastError())
		var st struct {
			MinBudget uint64      `json:"min_budget"`
			Least     *leastStats `json:"least_budget"`
		}
		require.NoError(t, json.Unmarshal([]byte(abiDTRStatsJSON(h)), &st))
		require.NotNil(t, st.Least, tc.ceiling)
		require.NotNil(t, st.Least.LeastReport, st.Least.Error)
		assert.Equal(t, uint64(2100), st.MinBudget, tc.ceiling)
		assert.Equal(t, st.MinBudget, st.Least.Budget, "a chain runs at its floor")
		assert.Equal(t, tc.replays == 1, st.Least.Replayed, tc.ceiling)
		require.Len(t, st.Least.Tries, tc.replays, tc.ceiling)
		for _, try := range st.Least.Tries {
			assert.Equal(t, "ok", try.Status)
		}
		require.Equal(t, 0, abiDTRDestroy(h))
	}
	h := abiDTRCreate(`{"usage": "engine"}`)
	require.Positive(t, h, lastError())
	defer abiDTRDestroy(h)
	runChain(t, h, 3)
	require.Equal(t, 0, abiDTRFinish(h))
	assert.NotContains(t, abiDTRStatsJSON(h), "least_budget", "not asked: no search")
}

// TestLeastOfAnUnbudgetedStepReplaysPastItsPeak: an unbudgeted engine frees a
// released storage at once, a budgeted one keeps a released external that a
// live tensor was computed from (its lineage; pinned, it cannot be evicted).
// So the peak of an unbudgeted step is no budget known to work: the corpus's
// DCGAN step on fakes (the generator's graph read as externals) peaked at
// 561.8 KiB unbudgeted and stopped at 917.4 KiB. The search replays past it.
func TestLeastOfAnUnbudgetedStepReplaysPastItsPeak(t *testing.T) {
	eng, err := evict.New(evict.Config{Record: true})
	require.NoError(t, err)
	x, err := eng.AddTensor(4000, true) // an external: a saved tensor of an earlier step's graph
	require.NoError(t, err)
	fresh := func(n uint64) []evict.Output { return []evict.Output{{Size: n, Alias: -1}} }
	_, y, err := eng.Call("read", []rc.TensorID{x}, fresh(1000), 1000, 0)
	require.NoError(t, err)
	require.NoError(t, eng.Release(x)) // the program drops it; y lives on
	_, z, err := eng.Call("big", []rc.TensorID{y[0]}, fresh(3000), 1000, 0)
	require.NoError(t, err)
	require.NoError(t, eng.Release(y[0]))
	require.NoError(t, eng.Release(z[0]))
	eng.Finish()
	peak := eng.Stats().PeakUsage
	require.Equal(t, uint64(5000), peak, "x is freed at its release when unbudgeted")
	rep, err := leastOf(eng)
	require.NoError(t, err)
	t.Logf("peak %d, floor %d, least %d (replayed %v), tries %+v", peak, rep.Floor, rep.Budget, rep.Replayed, rep.Tries)
	assert.True(t, rep.Replayed, "a replay finished at the budget found")
	assert.Greater(t, rep.Budget, peak, "a budgeted step keeps x while y lives: 4000 + 1000 + 3000")
	tr, err := eng.Recording()
	require.NoError(t, err)
	at, err := replay.Run(tr, replay.Options{Budget: rep.Budget, Plans: true, Region: true, OverheadLimit: -1})
	require.NoError(t, err)
	assert.True(t, at.Feasible(), at.Reason)
	below, err := replay.Run(tr, replay.Options{Budget: peak, Plans: true, Region: true, OverheadLimit: -1})
	require.NoError(t, err)
	assert.False(t, below.Feasible(), "the unbudgeted peak does not run the step under a budget")
}
