package main

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/allocator"
	"github.com/memscale/memscale/device"
)

// TestSetBudget: memscale_set_budget and memscale_set_budget_slack reach
// the device's allocator, show in its statistics (budget_bytes,
// budget_slack_ppm, cache_bound_bytes) and refuse bad values by name.
func TestSetBudget(t *testing.T) {
	a, err := allocatorFor(0)
	require.NoError(t, err)
	t.Cleanup(func() {
		abiSetBudget(0, 0)
		abiSetBudgetSlack(0, 0)
	})
	for _, tc := range []struct {
		name      string
		budget    int64
		slack     float64
		rc        int
		errPart   string
		wantBytes int64
		wantPPM   int64
	}{
		{name: "budget, default slack", budget: 512 * mib, rc: 0, wantBytes: 512 * mib, wantPPM: int64(allocator.DefaultBudgetSlack * 1e6)},
		{name: "slack 0.25", budget: 512 * mib, slack: 0.25, rc: 0, wantBytes: 512 * mib, wantPPM: 250000},
		{name: "budget ignored", budget: 512 * mib, slack: -1, rc: 0, wantBytes: 512 * mib, wantPPM: -1000000},
		{name: "negative budget", budget: -1, rc: -1, errPart: "memscale_set_budget"},
		{name: "NaN slack", budget: 512 * mib, slack: math.NaN(), rc: -1, errPart: "memscale_set_budget_slack"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := abiSetBudget(0, tc.budget)
			if rc == 0 {
				rc = abiSetBudgetSlack(0, tc.slack)
			}
			require.Equal(t, tc.rc, rc, lastError())
			if tc.rc != 0 {
				require.Contains(t, lastError(), tc.errPart)
				return
			}
			st := a.Stats()
			require.Equal(t, tc.wantBytes, st["budget_bytes"])
			require.Equal(t, tc.wantPPM, st["budget_slack_ppm"])
			if tc.slack >= 0 {
				bound := tc.wantBytes + int64(float64(tc.wantBytes)*float64(tc.wantPPM)/1e6)
				require.GreaterOrEqual(t, st["cache_bound_bytes"], bound-1)
			}
		})
	}
}

// TestStepBoundary: memscale_step_boundary reaches the device's allocator
// (num_steps counts the calls; with a budget, a repeated step is placed by
// the plan of the one before).
func TestStepBoundary(t *testing.T) {
	a, err := allocatorFor(0)
	require.NoError(t, err)
	t.Cleanup(func() { abiSetBudget(0, 0) })
	require.Equal(t, 0, abiSetBudget(0, 256*mib), lastError())
	before := a.Stats()
	for step := 0; step < 3; step++ {
		require.Equal(t, 0, abiStepBoundary(0), lastError())
		var ps []uintptr
		for i := 0; i < 8; i++ {
			p, err := a.Malloc(uint64(int64(4+i)*mib), 0)
			require.NoError(t, err)
			ps = append(ps, uintptr(p))
		}
		for _, p := range ps {
			require.NoError(t, a.Free(device.Ptr(p)))
		}
	}
	st := a.Stats()
	require.Equal(t, int64(3), st["num_steps"]-before["num_steps"])
	require.Positive(t, st["num_step_plan_placed"]-before["num_step_plan_placed"], "the third step is placed by the plan")
	require.Equal(t, -1, abiStepBoundary(-5))
	require.Contains(t, lastError(), "memscale_step_boundary")
}
