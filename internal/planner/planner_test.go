package planner

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/internal/placement"
	rc "github.com/memscale/memscale/recompute"
)

func loadTiny(t *testing.T) *rc.Trace {
	t.Helper()
	tr, err := rc.LoadTrace("../../cmd/memscale/testdata/tiny.log")
	require.NoError(t, err)
	return tr
}

func TestAnalyzeTinyTrace(t *testing.T) {
	tr := loadTiny(t)
	info := ModelInfo{Model: "tiny", BatchSize: 4, OptimizerState: 100, OptimizerStepPeak: 300}
	rep, err := Analyze(context.Background(), "tiny", tr, info, Options{
		Budgets: []Budget{{Label: "1KB", Bytes: 1000}, {Label: "10KB", Bytes: 10000}},
		Active:  &Budget{Label: "1500B", Bytes: 1500},
		Workers: 1,
	})
	require.NoError(t, err)
	m := rep.Memory
	// The trace's own peak, as the baseline replay counts it; the totals add
	// the optimizer's state.
	assert.Greater(t, m.TracePeak, uint64(0))
	assert.Equal(t, m.TracePeak+100, m.Peak)
	assert.GreaterOrEqual(t, m.Arena, m.AlignedPeak, "the arena is never below the peak")
	assert.GreaterOrEqual(t, m.FragmentationFloor, 0.0)
	assert.LessOrEqual(t, m.MinBudgetLowerBound, m.MinFeasibleBudget)
	assert.LessOrEqual(t, m.MinFeasibleBudget, m.Peak)
	require.Equal(t, "native", rep.Variants[0].Variant)
	for _, v := range rep.Variants {
		for _, b := range []struct {
			label string
			bytes uint64
		}{{"1KB", 1000}, {"10KB", 10000}} {
			assert.Equal(t, v.Status != "ok" || v.Peak > b.bytes, v.Violates["violates_"+b.label], "%+v", v)
		}
		require.NotNil(t, v.Accepted)
		if *v.Accepted {
			assert.LessOrEqual(t, v.Peak, uint64(1500))
		}
		if v.Pareto {
			assert.True(t, *v.Accepted, "the frontier is of accepted variants")
		}
	}
	require.Len(t, rep.Budgets, 2)
	assert.True(t, rep.Budgets[1].Native, "10 KB holds the whole step")
	assert.Equal(t, "safe", rep.Budgets[1].Profile)
	assert.Contains(t, rep.Summary, "tiny batch 4 needs")
	var out strings.Builder
	require.NoError(t, WriteText(&out, rep))
	assert.Contains(t, out.String(), "violates_1KB")
	assert.Contains(t, out.String(), "DTR minimum budget")
}

func TestAnalyzeBuffers(t *testing.T) {
	bufs := []placement.Buffer{{Size: 1000, Start: 0, End: 4}, {Size: 600, Start: 1, End: 3}, {Size: 600, Start: 3, End: 5}}
	rep, err := AnalyzeBuffers("snap", bufs, ModelInfo{}, Options{Budgets: []Budget{{Label: "1500B", Bytes: 1500}}})
	require.NoError(t, err)
	assert.Equal(t, uint64(1600), rep.Memory.Peak)
	assert.Equal(t, rep.Memory.Peak, rep.Memory.MinFeasibleBudget, "nothing evictable without ops")
	assert.False(t, rep.Budgets[0].Native)
	assert.Contains(t, rep.Summary, "no ops")
}

func TestDevices(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "", want: nil},
		{in: "h100", want: []string{"h100"}},
		{in: "H200, l4", want: []string{"h200", "l4"}},
		{in: "a100,4090", want: []string{"a100-80gb", "rtx4090"}},
		{in: "all", want: DeviceKeysInTableOrder()},
		{in: "v100", wantErr: `unknown device "v100" (known: a100-40gb, a100-80gb, h100, h200, l4, rtx4090)`},
	} {
		ds, err := ParseDevices(tc.in)
		if tc.wantErr != "" {
			assert.EqualError(t, err, tc.wantErr)
			continue
		}
		require.NoError(t, err, tc.in)
		var keys []string
		for _, d := range ds {
			keys = append(keys, d.Key)
			assert.Less(t, d.Usable(), d.Memory)
		}
		assert.Equal(t, tc.want, keys, tc.in)
	}
}

// DeviceKeysInTableOrder lists the table's keys in its order.
func DeviceKeysInTableOrder() []string {
	var k []string
	for _, d := range Devices() {
		k = append(k, d.Key)
	}
	return k
}

func TestPlanBatches(t *testing.T) {
	d, _ := LookupDevice("l4")
	mk := func(bs int, native bool, status string, over float64) *Report {
		return &Report{Info: ModelInfo{BatchSize: bs}, Devices: []Fit{{Device: &d, Native: native, Status: status, Overhead: over}}}
	}
	plans := PlanBatches([]*Report{mk(32, false, "oom", 0), mk(8, true, "ok", 1), mk(16, false, "ok", 1.2)})
	require.Len(t, plans, 1)
	p := plans[0]
	assert.Equal(t, 8, p.LargestNative)
	assert.Equal(t, 8, p.Largest11)
	assert.Equal(t, 16, p.Largest13)
	assert.Equal(t, []int{8, 16, 32}, []int{p.Rows[0].BatchSize, p.Rows[1].BatchSize, p.Rows[2].BatchSize})
}
