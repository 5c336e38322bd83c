package sweep

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/sharedtraces"
	rc "github.com/memscale/memscale/recompute"
	"github.com/memscale/memscale/replay"
)

// chainInputs returns two parsed synthetic traces.
func chainInputs(t testing.TB) []Input {
	t.Helper()
	dir := t.TempDir()
	return []Input{
		{Name: "chain8", Path: writeFile(t, dir, "chain8.log", chainTrace(8, 1000), false)},
		{Name: "chain16", Path: writeFile(t, dir, "chain16.log.gz", chainTrace(16, 500), true)},
	}
}

func TestRunSweep(t *testing.T) {
	inputs := chainInputs(t)
	heur := []evict.Heuristic{evict.DTR, evict.MSPS, evict.LRU}
	ratios := []float64{0.1, 0.3, 0.5, 0.7, 1}
	// Progress and TraceDone are called from Run's goroutine only: no
	// locking here (the race detector checks it).
	var (
		started   int
		finished  []int
		traceDone []string
	)
	cfg := Config{
		Ratios: ratios, Heuristics: heur, Workers: 4, Check: true,
		Progress: func(p Progress) {
			if p.Result == nil {
				started++
				return
			}
			finished = append(finished, p.Done)
			assert.Equal(t, 30, p.Total)
		},
		TraceDone: func(tr *TraceReport) { traceDone = append(traceDone, tr.Name) },
	}
	rep, err := Run(context.Background(), inputs, cfg)
	require.NoError(t, err)

	assert.Equal(t, 30, started)
	require.Len(t, finished, 30)
	for i, d := range finished {
		assert.Equal(t, i+1, d, "Done counts up")
	}
	assert.Equal(t, []string{"chain8", "chain16"}, traceDone, "traces reported in input order")
	assert.Equal(t, []string{"dtr", "msps", "lru"}, rep.Heuristics)
	assert.Equal(t, 4, rep.Workers)
	assert.Equal(t, "counting", rep.Memory)
	assert.Equal(t, 2.0, rep.OverheadLimit)
	assert.Zero(t, rep.Errors())
	assert.Zero(t, rep.Violations())
	require.Len(t, rep.Traces, 2)

	for _, tr := range rep.Traces {
		// chain n of size s: n+1 activations, the loss gradient and one
		// more gradient live at the start of the backward pass.
		assert.Positive(t, tr.Baseline.Peak)
		assert.Positive(t, tr.Baseline.Compute)
		require.Len(t, tr.Runs, len(heur)*len(ratios))
		for hi, h := range heur {
			for ri, r := range ratios {
				run := tr.Runs[hi*len(ratios)+ri]
				assert.Equal(t, tr.Name, run.Trace)
				assert.Equal(t, h.String(), run.Heuristic)
				assert.Equal(t, r, run.Ratio)
				assert.Equal(t, replay.Budget(r, tr.Baseline.Peak), run.Budget)
				assert.LessOrEqual(t, run.Peak, run.Budget, "%s %s %v", tr.Name, run.Heuristic, r)
				assert.Contains(t, []string{"ok", "oom", "over-limit"}, run.Status)
				if run.Feasible() {
					assert.GreaterOrEqual(t, run.Overhead, 1.0)
				}
				if run.VictimSearches > 0 {
					assert.Equal(t, run.VictimSearchTime/time.Duration(run.VictimSearches), run.VictimSearchMean)
				}
			}
		}
		// ratio 1 replays with no eviction at all, for every heuristic
		for hi := range heur {
			run := tr.Runs[hi*len(ratios)+len(ratios)-1]
			assert.Equal(t, "ok", run.Status)
			assert.Zero(t, run.Rematerializations)
			assert.Equal(t, tr.Baseline.Compute, run.Compute)
			assert.InDelta(t, 1.0, run.Overhead, 1e-3, "(1 + compute) / baseline compute")
		}
		// ratio 0.1 cannot hold an op's input and output: OOM
		assert.Equal(t, "oom", tr.Runs[0].Status)
		// the frontier is the feasible, non-dominated runs
		require.NotEmpty(t, tr.Frontier)
		var pts []Point
		var idx []int
		for i, r := range tr.Runs {
			assert.Equal(t, contains(tr.Frontier, i), r.Pareto)
			if r.Feasible() && !r.BudgetViolated {
				pts = append(pts, Point{float64(r.Budget), r.Overhead})
				idx = append(idx, i)
			}
		}
		var want []int
		for _, k := range Frontier(pts) {
			want = append(want, idx[k])
		}
		assert.Equal(t, want, tr.Frontier)
	}
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// TestRunSharesParsedTrace runs many replays of one parsed trace at once
// (run with -race): replay.Run must only read it, and the results must not
// depend on the number of workers.
func TestRunSharesParsedTrace(t *testing.T) {
	tr, err := rc.DecodeTrace(strings.NewReader(chainTrace(12, 256)))
	require.NoError(t, err)
	snapshot := cloneTrace(tr)
	instrs := cloneInstrs(tr)
	in := []Input{{Name: "a", Path: "mem", Trace: tr}, {Name: "b", Path: "mem", Trace: tr}}
	cfg := Config{Ratios: []float64{0.2, 0.4, 0.6, 0.8}, Heuristics: evict.Heuristics(), Workers: 8}
	par, err := Run(context.Background(), in, cfg)
	require.NoError(t, err)
	cfg.Workers = 1
	seq, err := Run(context.Background(), in, cfg)
	require.NoError(t, err)
	assert.Equal(t, snapshot, tr, "the parsed trace was modified")
	assert.Equal(t, instrs, cloneInstrs(tr), "the parsed trace's instructions were modified")
	for ti := range par.Traces {
		assert.Zero(t, par.Traces[ti].Baseline.Parse, "a given trace is not parsed again")
		for i := range par.Traces[ti].Runs {
			a, b := par.Traces[ti].Runs[i], seq.Traces[ti].Runs[i]
			assert.Equal(t, b.Status, a.Status)
			assert.Equal(t, b.Overhead, a.Overhead)
			assert.Equal(t, b.Evictions, a.Evictions)
			assert.Equal(t, b.Peak, a.Peak)
		}
	}
}

// cloneInstrs returns a deep copy of the trace's instructions.
func cloneInstrs(tr *rc.Trace) []rc.Instr {
	out := tr.Instructions()
	for i, in := range out {
		in.Args = append([]int32(nil), in.Args...)
		in.Outs = append([]rc.Out(nil), in.Outs...)
		in.Mutated = append([]int32(nil), in.Mutated...)
		out[i] = in
	}
	return out
}

func cloneTrace(tr *rc.Trace) *rc.Trace {
	c := *tr
	c.Names = append([]string(nil), tr.Names...)
	c.Outputs = append([]int32(nil), tr.Outputs...)
	return &c
}

func TestRunConfigErrors(t *testing.T) {
	in := chainInputs(t)[:1]
	tests := []struct {
		name    string
		cfg     Config
		inputs  []Input
		wantErr string
	}{
		{name: "no ratios", cfg: Config{Heuristics: []evict.Heuristic{evict.DTR}}, inputs: in, wantErr: "no budget ratios"},
		{name: "ratio 0", cfg: Config{Ratios: []float64{0}, Heuristics: []evict.Heuristic{evict.DTR}}, inputs: in, wantErr: "ratio 0 out of range"},
		{name: "ratio above 1", cfg: Config{Ratios: []float64{1.5}, Heuristics: []evict.Heuristic{evict.DTR}}, inputs: in, wantErr: "ratio 1.5 out of range"},
		{name: "no heuristics", cfg: Config{Ratios: []float64{0.5}}, inputs: in, wantErr: "no heuristics"},
		{name: "negative workers", cfg: Config{Ratios: []float64{0.5}, Heuristics: []evict.Heuristic{evict.DTR}, Workers: -1}, inputs: in, wantErr: "-1 workers"},
		{name: "no traces", cfg: Config{Ratios: []float64{0.5}, Heuristics: []evict.Heuristic{evict.DTR}}, wantErr: "no traces"},
		{name: "missing trace", cfg: Config{Ratios: []float64{0.5}, Heuristics: []evict.Heuristic{evict.DTR}},
			inputs: append([]Input{{Name: "x", Path: "/nonexistent/x.log"}}, in...), wantErr: "trace /nonexistent/x.log"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Run(context.Background(), tc.inputs, tc.cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	cfg := Config{Ratios: []float64{0.2, 0.4, 0.6, 0.8}, Heuristics: evict.Heuristics(), Workers: 1,
		Progress: func(p Progress) {
			if p.Result != nil {
				if n++; n == 3 {
					cancel()
				}
			}
		}}
	_, err := Run(ctx, chainInputs(t), cfg)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "sweep interrupted after")
}

// TestRunAllocatorModelClosesClean sweeps with the allocator memory model
// (a simulated card per run, as memscale replay --memory allocator does):
// each replay frees every block it placed, finished or stopped early, so no
// run reports a close error.
func TestRunAllocatorModelClosesClean(t *testing.T) {
	dir := t.TempDir()
	in := []Input{{Name: "chain10", Path: writeFile(t, dir, "chain10.log", chainTrace(10, 4<<20), false)}}
	cfg := Config{
		Ratios: []float64{0.1, 0.3, 0.5, 0.8, 1}, Heuristics: evict.Heuristics(), Workers: 2, Check: true,
		MemoryName: "allocator",
		Memory:     func(budget uint64) (replay.MemoryModel, error) { return replay.NewSimAllocatorModel(budget) },
	}
	rep, err := Run(context.Background(), in, cfg)
	require.NoError(t, err)
	assert.Equal(t, "allocator", rep.Memory)
	assert.Zero(t, rep.Errors())
	n, first := rep.CloseErrors()
	assert.Zero(t, n, "first close error: %s", first)
	statuses := map[string]int{}
	for _, r := range rep.Traces[0].Runs {
		assert.Equal(t, "allocator", r.Memory)
		assert.Empty(t, r.CloseError, "%s %v %s", r.Heuristic, r.Ratio, r.Status)
		statuses[r.Status]++
	}
	assert.Positive(t, statuses["ok"], "some runs finish: %v", statuses)
	assert.Positive(t, statuses["oom"]+statuses["over-limit"], "some runs stop early: %v", statuses)
}

// closingModel is a counting memory model that records Close.
type closingModel struct {
	replay.Counting
	closed *atomic.Int32
	fail   bool // the first Close fails
}

func (m closingModel) Name() string { return "test-model" }
func (m closingModel) Close() error {
	if m.closed.Add(1) == 1 && m.fail {
		return errors.New("2 allocations still live")
	}
	return nil
}

func TestRunMemoryFactory(t *testing.T) {
	in := chainInputs(t)[:1]
	var closed atomic.Int32
	cfg := Config{Ratios: []float64{0.5, 1}, Heuristics: []evict.Heuristic{evict.DTR}, MemoryName: "test",
		Memory: func(budget uint64) (replay.MemoryModel, error) {
			if budget == 0 {
				return nil, errors.New("budget 0 is unlimited, not a budgeted run")
			}
			return closingModel{closed: &closed}, nil
		}}
	rep, err := Run(context.Background(), in, cfg)
	require.NoError(t, err)
	assert.Equal(t, "test", rep.Memory)
	assert.Equal(t, int32(2), closed.Load(), "each run's model is closed")
	n, first := rep.CloseErrors()
	assert.Zero(t, n)
	assert.Empty(t, first)
	for _, r := range rep.Traces[0].Runs {
		assert.Equal(t, "test-model", r.Memory)
	}

	// A failing Close is a warning: the results stand.
	closed.Store(0)
	cfg.Workers = 1
	cfg.Memory = func(uint64) (replay.MemoryModel, error) { return closingModel{closed: &closed, fail: true}, nil }
	rep, err = Run(context.Background(), in, cfg)
	require.NoError(t, err)
	assert.Zero(t, rep.Errors())
	n, first = rep.CloseErrors()
	assert.Equal(t, 1, n)
	assert.Equal(t, "chain8 dtr 0.50: 2 allocations still live", first)
	assert.Equal(t, "ok", rep.Traces[0].Runs[0].Status)

	cfg.Memory = func(uint64) (replay.MemoryModel, error) { return nil, errors.New("no device") }
	rep, err = Run(context.Background(), in, cfg)
	require.NoError(t, err, "a failing run is recorded, not fatal")
	assert.Equal(t, 2, rep.Errors())
	r := rep.Traces[0].Runs[0]
	assert.Equal(t, StatusError, r.Status)
	assert.Equal(t, "memory model: no device", r.Reason)
	assert.False(t, r.Pareto)
}

func TestFinishTraceViolations(t *testing.T) {
	tr := &TraceReport{Name: "t", Runs: []RunResult{
		{Heuristic: "dtr", Ratio: 0.5, Budget: 100, Peak: 90, Status: "ok", Overhead: 1.2},
		{Heuristic: "dtr", Ratio: 0.8, Budget: 160, Peak: 170, Status: "ok", Overhead: 1.1, BudgetViolated: true},
		{Heuristic: "lru", Ratio: 0.5, Budget: 100, Peak: 100, Status: "oom", Overhead: 1.9},
		{Heuristic: "lru", Ratio: 0.8, Budget: 160, Peak: 150, Status: "ok", Overhead: 1.3},
	}}
	finishTrace(tr)
	assert.Equal(t, []int{1}, tr.Violations)
	assert.Equal(t, []int{0}, tr.Frontier, "a run over its budget is not on the frontier")
	assert.True(t, tr.Runs[0].Pareto)
	assert.False(t, tr.Runs[1].Pareto)
	assert.False(t, tr.Runs[2].Pareto, "an OOM run is never on the frontier")
	rep := &Report{Traces: []*TraceReport{tr}}
	assert.Equal(t, 1, rep.Violations())
}

// TestSharedTraces sweeps one shared trace with the default heuristic; it
// skips when the shared traces are absent.
func TestSharedTraces(t *testing.T) {
	traces := sharedtraces.ForTest(t)
	var unet *sharedtraces.Trace
	for i := range traces {
		if traces[i].Name == "unet" {
			unet = &traces[i]
		}
	}
	if unet == nil {
		t.Skip("skipping: no unet trace among the shared traces")
	}
	rep, err := Run(context.Background(), []Input{{Name: unet.Name, Path: unet.Path}},
		Config{Ratios: []float64{0.5, 0.9}, Heuristics: []evict.Heuristic{evict.Default.Resolve()}, Check: true})
	require.NoError(t, err)
	tr := rep.Traces[0]
	// The DTR authors' simulator's baseline of this trace.
	assert.Equal(t, uint64(8415764640), tr.Baseline.Peak)
	assert.Equal(t, int64(435278292), tr.Baseline.Compute)
	assert.Zero(t, rep.Violations())
	assert.Zero(t, rep.Errors())
	for _, r := range tr.Runs {
		assert.Equal(t, "ok", r.Status, "%+v", r)
		assert.Greater(t, r.Overhead, 1.0)
		assert.Less(t, r.Overhead, 1.5)
		assert.Positive(t, r.Evictions)
	}
}
