package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runChain registers a parameter and a chain of n ops of 1000 bytes each on
// engine h, releasing each activation once the next one is computed.
func runChain(t *testing.T, h int64, n int) {
	t.Helper()
	w := abiDTRTensor(h, 100, 1)
	require.GreaterOrEqual(t, w, int64(0), lastError())
	x := w
	for i := 0; i < n; i++ {
		op, outs := abiDTRCall(h, []int64{x}, []int64{1000}, []int32{-1}, 10, 0)
		require.GreaterOrEqual(t, op, int64(0), lastError())
		if x != w {
			require.Equal(t, 0, abiDTRRelease(h, x), lastError())
		}
		x = outs[0]
	}
}

func TestTuneReportsAChoiceTheNextEngineAccepts(t *testing.T) {
	h := abiDTRCreate(`{"budget": 1000000, "heuristic": "auto", "usage": "engine"}`)
	require.Positive(t, h, lastError())
	defer abiDTRDestroy(h)
	runChain(t, h, 20)
	js := abiDTRTune(h)
	require.NotEmpty(t, js, lastError())
	var rep tuneReport
	require.NoError(t, json.Unmarshal([]byte(js), &rep))
	assert.True(t, rep.Feasible)
	assert.Equal(t, "anc-sqrt", rep.Choice, "nothing is evicted: every candidate ties and the default is first")
	assert.Equal(t, uint64(1000000), rep.Budget)
	assert.Equal(t, 40, rep.Instructions, "1 constant, 20 calls, 19 releases")
	assert.Len(t, rep.Trials, 52)
	for _, tr := range rep.Trials {
		assert.NotContains(t, tr.Candidate, "sim", "a live engine is not offered simulator mode")
	}
	assert.InDelta(t, 1.0, rep.Overhead, 0.01)
	assert.Equal(t, rep.Overhead, rep.DefaultOverhead)

	cfg, err := json.Marshal(rep.Config)
	require.NoError(t, err)
	next := abiDTRCreate(string(cfg))
	require.Positive(t, next, "the chosen config must be accepted: %s", lastError())
	require.Equal(t, 0, abiDTRDestroy(next))
}

func TestTuneErrors(t *testing.T) {
	for _, tc := range []struct {
		name, config, want string
	}{
		{"not recording", `{"budget": 1000000, "heuristic": "dtr"}`, "does not record"},
		{"no budget", `{"heuristic": "auto"}`, "no budget"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := abiDTRCreate(tc.config)
			require.Positive(t, h, lastError())
			defer abiDTRDestroy(h)
			runChain(t, h, 3)
			assert.Empty(t, abiDTRTune(h))
			assert.Contains(t, lastError(), "memscale_dtr_tune")
			assert.Contains(t, lastError(), tc.want)
		})
	}
	assert.Empty(t, abiDTRTune(987654))
	assert.Contains(t, lastError(), "unknown engine handle 987654")
}

func TestRecordConfigKey(t *testing.T) {
	h := abiDTRCreate(`{"budget": 1000000, "record": true, "heuristic": "msps"}`)
	require.Positive(t, h, lastError())
	defer abiDTRDestroy(h)
	runChain(t, h, 3)
	assert.NotEmpty(t, abiDTRTune(h), lastError())
	assert.Negative(t, abiDTRCreate(`{"record": "yes"}`))
	assert.Contains(t, lastError(), "record")
}
