package main

import (
	"encoding/json"
	"testing"

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
		replays         int // the unbudgeted chain's floor is its peak: no replay needed
	}{
		{`{"least_budget": true, "usage": "engine"}`, "unbudgeted: the step's peak", 0},
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
