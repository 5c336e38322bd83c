package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDTRStress(t *testing.T) {
	tests := []struct {
		name   string
		config string
		extra  int64
	}{
		{"no budget", `{"stress": true}`, 0},
		{"the budget and extra are ignored", `{"stress": true, "budget": 150, "heuristic": "lru"}`, 1 << 40},
		{"region", `{"stress": true, "defaults": "region"}`, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newTestEngine(t, tc.config)
			ts := dtrChain(t, h, 3, 200) // a pinned parameter, then 3 ops
			_, st := abiDTRStatus(h)
			assert.Zero(t, st.Budget, "a stress engine reports no budget")

			// every output goes, in one call, however small (region: no
			// minimum size)
			n, ids := abiDTREvict(h, tc.extra, 8)
			require.Equal(t, int32(3), n, lastError())
			assert.Equal(t, ts, ids)
			n, _ = abiDTREvict(h, tc.extra, 8)
			assert.Equal(t, int32(0), n, "nothing left: %s", lastError())
			_, st = abiDTRStatus(h)
			assert.Equal(t, dtrStatus{Usage: 100, BytesEvicted: 600, PeakUsage: 700, NextOp: 3, NextTensor: 4}, st)

			// a rebuilt storage is not evicted again
			got, _, steps := abiDTRPlan(h, ts[1], 4)
			require.Equal(t, int32(2), got, lastError())
			for _, op := range steps {
				require.Equal(t, 0, abiDTRRematerialized(h, op, 5), lastError())
			}
			n, _ = abiDTREvict(h, tc.extra, 8)
			assert.Equal(t, int32(0), n, "rebuilt storages stay: %s", lastError())

			m := statsOf(t, h)
			assert.Equal(t, true, m["config"].(map[string]any)["stress"])
			assert.Equal(t, 2.0, m["rematerializations"])
			assert.Equal(t, 0.0, m["budget"])
		})
	}
	h := newTestEngine(t, `{}`)
	assert.Equal(t, false, statsOf(t, h)["config"].(map[string]any)["stress"])
	assert.Equal(t, int64(-1), abiDTRCreate(`{"stress": "yes"}`))
	assert.Contains(t, lastError(), `stress "yes": want true or false`)
}

func TestDTRMinBudget(t *testing.T) {
	h := newTestEngine(t, `{"heuristic": "lru"}`) // no budget: measuring
	x := abiDTRTensor(h, 1000, 1)                 // a parameter
	require.GreaterOrEqual(t, x, int64(0), lastError())
	_, a := abiDTRCall(h, []int64{x}, []int64{3000}, []int32{-1}, 10, 0)
	_, gw := abiDTRCall(h, []int64{a[0], a[0]}, []int64{500, 2000, 0}, []int32{-1, -1, 0}, 10, 0)
	require.Equal(t, 0, abiDTRPin(h, gw[0]), lastError()) // a gradient
	// 1000 pinned + 3000 + 500 + 2000 (the view is a's storage)
	want := map[string]any{"pinned_at_registration": 1000.0, "pinned_later": 0.0, "under_min_size": 0.0, "op_bytes": 5500.0, "op": "fuzz_op"}
	m := statsOf(t, h)
	assert.Equal(t, 6500.0, m["min_budget"])
	assert.Equal(t, want, m["min_budget_parts"])

	_, _ = abiDTRCall(h, []int64{a[0]}, []int64{4000}, []int32{-1}, 10, 0)
	m = statsOf(t, h)
	assert.Equal(t, 8500.0, m["min_budget"], "1000 + 500 pinned later + 3000 + 4000")
	assert.Equal(t, map[string]any{"pinned_at_registration": 1000.0, "pinned_later": 500.0, "under_min_size": 0.0, "op_bytes": 7000.0, "op": "fuzz_op"},
		m["min_budget_parts"])

	// a budget below what this point needs: the error says so first
	require.Equal(t, 0, abiDTRLock(h, a[0]))
	require.Equal(t, 0, abiDTRSetBudget(h, 4000))
	n, _ := abiDTREvict(h, 100, 8) // gw[1] (2000) and the 4000 go, then nothing
	require.Equal(t, int32(2), n, lastError())
	n, _ = abiDTREvict(h, 100, 8)
	require.Equal(t, int32(-1), n)
	msg := lastError()
	assert.True(t, strings.HasPrefix(msg, "memscale_dtr_evict: evict: budget 3.9 KiB is below what this step needs at this point: "+
		"1000 B pinned at registration (parameters, inputs) + 500 B pinned later (gradients) + "+
		"2.9 KiB locked by the running op + 100 B requested; the step's minimum budget so far is 8.3 KiB (largest op: fuzz_op); "+
		"usage 4500 + 100 requested > budget 4000: nothing evictable ("), msg)
}
