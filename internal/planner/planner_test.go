package planner

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/evict"
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

// gradTrace is a step whose gradient g (4096 bytes, made by line 7) the
// region pins after line 11, and whose loss l (8 bytes) stays resident
// to the end.
const gradTrace = `{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}
{"INSTRUCTION":"CONSTANT","NAME":"w"}
{"INSTRUCTION":"MEMORY","MEMORY":"4096","NAME":"w"}
{"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"a","RESULT":["x"],"TIME":"1000"}
{"INSTRUCTION":"MEMORY","MEMORY":"8192","NAME":"x"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x"}
{"ARGS":["x"],"INSTRUCTION":"CALL","NAME":"loss","RESULT":["l","g"],"TIME":"1000"}
{"INSTRUCTION":"MEMORY","MEMORY":"8","NAME":"l"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"l"}
{"INSTRUCTION":"MEMORY","MEMORY":"4096","NAME":"g"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"g"}
{"ARGS":["x"],"INSTRUCTION":"CALL","NAME":"b","RESULT":["y"],"TIME":"1000"}
{"INSTRUCTION":"MEMORY","MEMORY":"8192","NAME":"y"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"y"}
{"INSTRUCTION":"RELEASE","NAME":"x"}
{"INSTRUCTION":"RELEASE","NAME":"y"}
`

// TestPlanReplaysTheRegion: the planner's lower bound is the region's: the
// gradient the region pinned is pinned (ModelInfo.Pins), the loss, under
// the region's minimum evictee size, is never evicted. At op b: w 4096 +
// g 4096 + l 8 + x and y 16384, all of the peak. Before, the replay ran the
// engine's defaults on the trace alone: 20480 (g and l evictable), and at
// 90 % of the peak it evicted g, which the region cannot.
func TestPlanReplaysTheRegion(t *testing.T) {
	tr, err := rc.ReadTrace(strings.NewReader(gradTrace), rc.ParseOptions{})
	require.NoError(t, err)
	pins := []Pin{{After: 11, Line: 7, Out: 1}}
	rep, err := Analyze(context.Background(), "grad", tr, ModelInfo{Pins: pins}, Options{Ratios: []float64{0.9}, Workers: 1})
	require.NoError(t, err)
	assert.Equal(t, uint64(4096+4096+8+16384), rep.Memory.MinBudgetLowerBound)
	assert.Equal(t, uint64(4096+4096+8+16384), rep.Memory.TracePeak)
	require.Len(t, rep.Variants, 2)
	assert.Equal(t, "oom", rep.Variants[1].Status, "%+v", rep.Variants[1])

	cfg, err := RegionConfig(1<<20, evict.Auto)
	require.NoError(t, err)
	assert.Equal(t, uint64(evict.RegionEvicteeMinSize), cfg.EvicteeMinSize)
	assert.True(t, cfg.Park)
	assert.True(t, cfg.Record, "the auto policy records its first step")

	_, err = withPins(tr, []Pin{{After: 11, Line: 5, Out: 0}})
	assert.ErrorContains(t, err, "line 5 (after line 11) is no instruction of the trace")
	_, err = withPins(tr, []Pin{{After: 11, Line: 7, Out: 2}})
	assert.ErrorContains(t, err, "without output 2")
}

// chainTrace is a forward chain of n ops of 4096 bytes each from a
// parameter, and a backward that reads them in reverse.
func chainTrace(n int) string {
	var b strings.Builder
	b.WriteString(`{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}` + "\n")
	b.WriteString(`{"INSTRUCTION":"CONSTANT","NAME":"a0"}` + "\n" + `{"INSTRUCTION":"MEMORY","MEMORY":"4096","NAME":"a0"}` + "\n")
	call := func(op string, args []string, res string, ns int) {
		fmt.Fprintf(&b, `{"ARGS":["%s"],"INSTRUCTION":"CALL","NAME":"%s","RESULT":["%s"],"TIME":"%d"}`+"\n", strings.Join(args, `","`), op, res, ns)
		fmt.Fprintf(&b, `{"INSTRUCTION":"MEMORY","MEMORY":"4096","NAME":"%s"}`+"\n"+`{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"%s"}`+"\n", res, res)
	}
	for i := 1; i <= n; i++ {
		call("f", []string{fmt.Sprintf("a%d", i-1)}, fmt.Sprintf("a%d", i), 1000*(1+i%3))
	}
	b.WriteString(`{"ANNOTATION":"BACKWARD","INSTRUCTION":"ANNOTATE"}` + "\n")
	call("g", []string{fmt.Sprintf("a%d", n)}, fmt.Sprintf("d%d", n), 1000)
	for i := n - 1; i >= 1; i-- {
		call("g", []string{fmt.Sprintf("d%d", i+1), fmt.Sprintf("a%d", i)}, fmt.Sprintf("d%d", i), 1000)
		fmt.Fprintf(&b, `{"INSTRUCTION":"RELEASE","NAME":"d%d"}`+"\n"+`{"INSTRUCTION":"RELEASE","NAME":"a%d"}`+"\n", i+1, i+1)
	}
	return b.String()
}

// TestPlanAutoIsTheRegionsTuning: with the auto policy each DTR variant is
// the step after the region's first: tuned (the choice named), the first
// step's outcome kept.
func TestPlanAutoIsTheRegionsTuning(t *testing.T) {
	tr, err := rc.ReadTrace(strings.NewReader(chainTrace(16)), rc.ParseOptions{})
	require.NoError(t, err)
	rep, err := Analyze(context.Background(), "chain", tr, ModelInfo{}, Options{Heuristic: evict.Auto, Ratios: []float64{0.5, 0.7}, Workers: 1})
	require.NoError(t, err)
	tuned := 0
	for _, v := range rep.Variants[1:] {
		if v.Status == "ok" {
			assert.True(t, strings.HasPrefix(v.Heuristic, "auto: "), v.Heuristic)
			tuned++
		}
	}
	assert.Positive(t, tuned, "%+v", rep.Variants)
}
