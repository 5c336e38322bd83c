// Package sweep runs many DTR trace replays: every (trace, heuristic, budget
// ratio) combination, on a pool of workers. Each trace is parsed once and
// its baseline (unlimited budget: peak bytes, compute) measured once; the
// budget of a run is its ratio times the baseline peak, or an absolute
// budget in bytes (Config.Budgets, flagged violates_<label> on every run). The parsed trace is
// shared read-only by all the runs of that trace (replay.Run only reads a
// *recompute.Trace). The package also derives what a report needs: budget
// violations, the Pareto frontier of budget against overhead, and tables,
// CSV, JSON and Markdown renderings.
package sweep

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/memscale/memscale/autotune"
	"github.com/memscale/memscale/evict"
	rc "github.com/memscale/memscale/recompute"
	"github.com/memscale/memscale/replay"
)

// Run statuses beyond replay's ("ok", "oom", "over-limit").
const (
	// StatusOK is a run that finished under its budget.
	StatusOK = "ok"
	// StatusError is a run that failed (a replay error, not a budget
	// outcome); Reason holds the error.
	StatusError = "error"
)

// Budget is an absolute memory budget as the user wrote it ("24GiB").
type Budget struct {
	// Label is how the user wrote it; Bytes its value.
	Label string `json:"label"`
	Bytes uint64 `json:"bytes"`
}

// MemoryFactory returns the memory model for one run with the given budget
// (0 = unlimited). Each run gets its own model.
type MemoryFactory func(budget uint64) (replay.MemoryModel, error)

// Config configures a sweep.
type Config struct {
	// Ratios are the budget ratios (fractions of the baseline peak), each in
	// (0, 1].
	Ratios []float64
	// Budgets are absolute budgets: each trace is also replayed at each of
	// them (after its ratios; a budget at or above the baseline peak evicts
	// nothing), and every run is flagged violates_<label> for each.
	Budgets []Budget
	// Heuristics are the heuristics to compare.
	Heuristics []evict.Heuristic
	// Engine is the base engine configuration; Heuristic and Budget are set
	// per run.
	Engine evict.Config
	// OverheadLimit is passed to replay.Options (0 = replay's default 2x,
	// negative = no limit).
	OverheadLimit float64
	// Memory makes the memory model of each budgeted run; nil = counting.
	// The baseline always counts bytes. A model that is an io.Closer is
	// closed after its run.
	Memory MemoryFactory
	// MemoryName names the model Memory makes, for the report.
	MemoryName string
	// Check makes every replay verify its invariants.
	Check bool
	// Workers is the number of runs in parallel (0 = GOMAXPROCS).
	Workers int
	// Progress, when set, is told when runs start and finish. It is called
	// from the goroutine that called Run, never concurrently.
	Progress func(Progress)
	// TraceDone, when set, receives each trace's report as soon as all its
	// runs are done, in input order, from the goroutine that called Run.
	TraceDone func(*TraceReport)
}

// Progress is a progress event.
type Progress struct {
	// Done and Total count finished and all runs.
	Done, Total int
	// Trace, Heuristic and Ratio name the run.
	Trace     string
	Heuristic string
	Ratio     float64
	// Result is nil when the run starts, set when it has finished.
	Result *RunResult
}

// Baseline is a trace's unlimited-budget replay.
type Baseline struct {
	// Peak is the peak memory in bytes.
	Peak uint64 `json:"peak_bytes"`
	// Compute is the trace's compute (sum of op times) in ns.
	Compute int64 `json:"compute_ns"`
	// Instructions is the number of instructions replayed.
	Instructions int `json:"instructions"`
	// Parse and Wall are the parse and baseline replay wall times in ns.
	Parse time.Duration `json:"parse_ns"`
	Wall  time.Duration `json:"wall_ns"`
}

// RunResult is one (trace, heuristic, ratio) replay.
type RunResult struct {
	// Trace is the trace name.
	Trace string `json:"trace"`
	// Heuristic is the heuristic's name.
	Heuristic string `json:"heuristic"`
	// Ratio is the budget ratio and Budget the budget in bytes; for a run at
	// an absolute budget (Config.Budgets) BudgetLabel names it and Ratio is
	// budget / baseline peak (above 1 when the trace fits it).
	Ratio       float64 `json:"ratio"`
	Budget      uint64  `json:"budget_bytes"`
	BudgetLabel string  `json:"budget_label,omitempty"`
	// Violates holds violates_<label> for each of Config.Budgets: the run
	// did not finish, or its peak is above that budget.
	Violates map[string]bool `json:"violates,omitempty"`
	// Memory is the memory model's name.
	Memory string `json:"memory"`
	// Status is "ok", "oom", "over-limit" or "error"; Reason explains
	// anything but ok.
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	// Overhead is total compute / baseline compute (up to where the run
	// stopped when it did not finish).
	Overhead float64 `json:"overhead"`
	// Compute is the compute spent in ns, rematerialization included.
	Compute int64 `json:"compute_ns"`
	// The engine's counters.
	Evictions          int64 `json:"evictions"`
	EagerEvictions     int64 `json:"eager_evictions"`
	Banished           int64 `json:"banished"`
	Rematerializations int64 `json:"rematerializations"`
	SwapsOut           int64 `json:"swaps_out"`
	SwapsIn            int64 `json:"swaps_in"`
	// Peak is the peak memory in bytes.
	Peak uint64 `json:"peak_bytes"`
	// VictimSearches counts victim selections, VictimSearchTime their
	// total wall time and VictimSearchMean the mean per search.
	VictimSearches   int64         `json:"victim_searches"`
	VictimSearchTime time.Duration `json:"victim_search_ns"`
	VictimSearchMean time.Duration `json:"victim_search_mean_ns"`
	// Instructions is the number of trace instructions executed.
	Instructions int `json:"instructions"`
	// Wall is the run's wall time.
	Wall time.Duration `json:"wall_ns"`
	// CloseError is what closing the run's memory model reported. A replay
	// frees every block it placed before it returns, so an error here means
	// a leak (a bug) or a failure to release the model's device; the run's
	// results stand, and callers show it as a warning.
	CloseError string `json:"close_error,omitempty"`
	// BudgetViolated is set when Peak > Budget: a bug, never expected.
	BudgetViolated bool `json:"budget_violated"`
	// Pareto is set when the run is on its trace's Pareto frontier.
	Pareto bool `json:"pareto"`
	// For the auto policy: the results above are the second step's, run
	// with Tuned, the configuration package autotune chose (in TuneWall)
	// from the first step, which ran the default heuristic and ended with
	// FirstStepStatus and FirstStepOverhead. Wall covers both steps, not
	// the tuning.
	Tuned             string        `json:"tuned,omitempty"`
	TuneWall          time.Duration `json:"tune_ns,omitempty"`
	FirstStepStatus   string        `json:"first_step_status,omitempty"`
	FirstStepOverhead float64       `json:"first_step_overhead,omitempty"`
}

// Feasible reports whether the run finished under its budget.
func (r *RunResult) Feasible() bool { return r.Status == StatusOK }

// TraceReport is the sweep of one trace.
type TraceReport struct {
	// Name and Path identify the trace.
	Name string `json:"name"`
	Path string `json:"path"`
	// Baseline is the unlimited-budget replay.
	Baseline Baseline `json:"baseline"`
	// Runs are ordered by heuristic (the configured order), then ratio, then
	// absolute budget (Config.Budgets, in their order).
	Runs []RunResult `json:"runs"`
	// Frontier indexes Runs: the feasible runs (finished within their
	// budget) no other feasible run beats on both budget and overhead, by
	// increasing budget.
	Frontier []int `json:"frontier"`
	// Violations indexes Runs whose peak exceeded the budget.
	Violations []int `json:"violations"`
}

// Report is a whole sweep.
type Report struct {
	// Ratios, Budgets and Heuristics are what was swept.
	Ratios     []float64 `json:"ratios"`
	Budgets    []Budget  `json:"budgets,omitempty"`
	Heuristics []string  `json:"heuristics"`
	// Memory is the memory model of the budgeted runs.
	Memory string `json:"memory"`
	// OverheadLimit is the limit in force (<= 0: none).
	OverheadLimit float64 `json:"overhead_limit"`
	// SimulatorCompat reports the engine's simulator-compatibility mode.
	SimulatorCompat bool `json:"simulator_compat"`
	// Workers is the number of parallel runs.
	Workers int `json:"workers"`
	// Traces are the per-trace results, in input order.
	Traces []*TraceReport `json:"traces"`
	// Wall is the sweep's wall time.
	Wall time.Duration `json:"wall_ns"`
}

// Errors counts the runs that ended in StatusError.
func (r *Report) Errors() int {
	n := 0
	for _, t := range r.Traces {
		for i := range t.Runs {
			if t.Runs[i].Status == StatusError {
				n++
			}
		}
	}
	return n
}

// CloseErrors counts the runs whose memory model reported an error when
// closed, and returns the first such error.
func (r *Report) CloseErrors() (int, string) {
	n, first := 0, ""
	for _, t := range r.Traces {
		for i := range t.Runs {
			if e := t.Runs[i].CloseError; e != "" {
				if n == 0 {
					first = fmt.Sprintf("%s %s %s: %s", t.Runs[i].Trace, t.Runs[i].Heuristic, FormatRatio(t.Runs[i].Ratio), e)
				}
				n++
			}
		}
	}
	return n, first
}

// Violations counts the runs whose peak exceeded the budget.
func (r *Report) Violations() int {
	n := 0
	for _, t := range r.Traces {
		n += len(t.Violations)
	}
	return n
}

func (c *Config) validate() error {
	if len(c.Ratios) == 0 {
		return errors.New("sweep: no budget ratios")
	}
	for _, r := range c.Ratios {
		if !(r > 0 && r <= 1) {
			return fmt.Errorf("sweep: ratio %v out of range (0, 1]", r)
		}
	}
	for _, b := range c.Budgets {
		if b.Bytes == 0 {
			return fmt.Errorf("sweep: budget %q of 0 bytes", b.Label)
		}
	}
	if len(c.Heuristics) == 0 {
		return errors.New("sweep: no heuristics")
	}
	if c.Workers < 0 {
		return fmt.Errorf("sweep: %d workers", c.Workers)
	}
	return nil
}

// job is one budgeted run: ratio indexes Config.Ratios, then Config.Budgets.
type job struct {
	trace, heur, ratio int
}

// budgetOf is the budget of a job's run in bytes, its ratio of the peak and
// its label (empty for a ratio).
func (c *Config) budgetOf(j job, peak uint64) (uint64, float64, string) {
	if j.ratio < len(c.Ratios) {
		r := c.Ratios[j.ratio]
		return replay.Budget(r, peak), r, ""
	}
	b := c.Budgets[j.ratio-len(c.Ratios)]
	ratio := 0.0
	if peak > 0 {
		ratio = float64(b.Bytes) / float64(peak)
	}
	return b.Bytes, ratio, b.Label
}

// flagBudgets sets r.Violates for the tracked budgets.
func flagBudgets(r *RunResult, budgets []Budget) {
	if len(budgets) == 0 {
		return
	}
	r.Violates = make(map[string]bool, len(budgets))
	for _, b := range budgets {
		r.Violates["violates_"+b.Label] = !r.Feasible() || r.Peak > b.Bytes
	}
}

// event is a worker's message to Run's goroutine.
type event struct {
	job    job
	result *RunResult // nil: started
}

// Run sweeps inputs under cfg. It fails before any budgeted run if a trace
// cannot be read or parsed, or its baseline does not replay. A failing
// budgeted run is recorded with StatusError and the sweep goes on; callers
// check Report.Errors and Report.Violations. Cancelling ctx stops the sweep
// after the runs in progress (their replays are not interruptible) and
// returns ctx's error.
func Run(ctx context.Context, inputs []Input, cfg Config) (*Report, error) {
	start := time.Now()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if len(inputs) == 0 {
		return nil, errors.New("sweep: no traces")
	}
	workers := cfg.Workers
	if workers == 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	rep := &Report{
		Ratios:          append([]float64(nil), cfg.Ratios...),
		Budgets:         append([]Budget(nil), cfg.Budgets...),
		Memory:          replay.Counting{}.Name(),
		OverheadLimit:   cfg.OverheadLimit,
		SimulatorCompat: cfg.Engine.SimulatorCompat,
		Workers:         workers,
		Traces:          make([]*TraceReport, len(inputs)),
	}
	if rep.OverheadLimit == 0 {
		rep.OverheadLimit = replay.DefaultOverheadLimit
	}
	for _, h := range cfg.Heuristics {
		rep.Heuristics = append(rep.Heuristics, h.String())
	}
	if cfg.Memory != nil && cfg.MemoryName != "" {
		rep.Memory = cfg.MemoryName
	}

	// Phase 1: parse every trace and replay its baseline.
	traces := make([]*rc.Trace, len(inputs))
	loadErrs := make([]error, len(inputs))
	parallel(len(inputs), workers, func(i int) {
		traces[i], rep.Traces[i], loadErrs[i] = baseline(inputs[i])
	})
	if err := errors.Join(loadErrs...); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// Phase 2: the budgeted runs. Trace by trace, so that each trace's
	// report is ready early; within a trace the smallest (slowest) budgets
	// first, so that the pool ends with short runs.
	var jobs []job
	perHeur := len(cfg.Ratios) + len(cfg.Budgets)
	for t := range inputs {
		rep.Traces[t].Runs = make([]RunResult, len(cfg.Heuristics)*perHeur)
		for r := range perHeur {
			for h := range cfg.Heuristics {
				jobs = append(jobs, job{trace: t, heur: h, ratio: r})
			}
		}
	}
	remaining := make([]int, len(inputs))
	for _, j := range jobs {
		remaining[j.trace]++
	}

	jobCh := make(chan job)
	events := make(chan event, workers)
	var wg sync.WaitGroup
	for range min(workers, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobCh {
				events <- event{job: j}
				t := rep.Traces[j.trace]
				budget, ratio, label := cfg.budgetOf(j, t.Baseline.Peak)
				res := runOne(traces[j.trace], t, cfg, cfg.Heuristics[j.heur], budget, ratio)
				res.BudgetLabel = label
				flagBudgets(&res, cfg.Budgets)
				events <- event{job: j, result: &res}
			}
		}()
	}
	go func() {
		defer close(jobCh)
		for _, j := range jobs {
			select {
			case jobCh <- j:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		wg.Wait()
		close(events)
	}()

	done, nextReport := 0, 0
	for ev := range events {
		j := ev.job
		tr := rep.Traces[j.trace]
		_, ratio, _ := cfg.budgetOf(j, tr.Baseline.Peak)
		p := Progress{Done: done, Total: len(jobs), Trace: tr.Name, Heuristic: cfg.Heuristics[j.heur].String(), Ratio: ratio}
		if ev.result == nil {
			if cfg.Progress != nil {
				cfg.Progress(p)
			}
			continue
		}
		tr.Runs[j.heur*perHeur+j.ratio] = *ev.result
		done++
		p.Done, p.Result = done, ev.result
		if cfg.Progress != nil {
			cfg.Progress(p)
		}
		remaining[j.trace]--
		for nextReport < len(inputs) && remaining[nextReport] == 0 {
			finishTrace(rep.Traces[nextReport])
			if cfg.TraceDone != nil {
				cfg.TraceDone(rep.Traces[nextReport])
			}
			nextReport++
		}
	}
	if done < len(jobs) {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("sweep interrupted after %d of %d runs: %w", done, len(jobs), err)
		}
		return nil, fmt.Errorf("sweep: only %d of %d runs finished", done, len(jobs))
	}
	rep.Wall = time.Since(start)
	return rep, nil
}

// parallel calls fn(0..n-1) on up to workers goroutines and waits.
func parallel(n, workers int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// baseline parses an input (unless it is parsed already) and replays it with
// no budget.
func baseline(in Input) (*rc.Trace, *TraceReport, error) {
	tr := in.Trace
	var parse time.Duration
	if tr == nil {
		t0 := time.Now()
		var err error
		if tr, err = rc.LoadTrace(in.Path); err != nil {
			return nil, nil, err
		}
		parse = time.Since(t0)
	}
	res, err := replay.Run(tr, replay.Options{OverheadLimit: -1})
	if err != nil {
		return nil, nil, fmt.Errorf("trace %s: baseline replay: %w", in.Path, err)
	}
	if res.Status != replay.OK {
		return nil, nil, fmt.Errorf("trace %s: baseline replay ended %s: %s", in.Path, res.Status, res.Reason)
	}
	rep := &TraceReport{Name: in.Name, Path: in.Path, Baseline: Baseline{
		Peak: res.Peak, Compute: res.BaseCompute, Instructions: res.Instructions, Parse: parse, Wall: res.Wall,
	}}
	return tr, rep, nil
}

// runOne replays tr with heuristic h at budget bytes (ratio of the baseline
// peak). The
// auto policy runs as training would: a first step with the default
// heuristic and the engine recording, a tuning pass over the recording
// (package autotune, on the run's memory model), and a second step with the chosen
// configuration, which is what the run reports.
func runOne(tr *rc.Trace, t *TraceReport, cfg Config, h evict.Heuristic, budget uint64, ratio float64) (out RunResult) {
	out = RunResult{Trace: t.Name, Heuristic: h.String(), Ratio: ratio, Budget: budget, Memory: replay.Counting{}.Name()}
	engine := cfg.Engine
	engine.Heuristic = h
	if h == evict.Auto {
		first, err := replayOnce(tr, cfg, out.Budget, engine, true, &out)
		if err != nil {
			return out
		}
		out.FirstStepStatus, out.FirstStepOverhead = first.Status.String(), first.Overhead
		program := first.Recording
		if !first.Feasible() || program == nil {
			// a first step that did not finish recorded only part of the
			// step; the program is the trace (the recording of a finished
			// step is identical to it: replay's TestRecordingReplaysIdentically)
			program = tr
		}
		base := cfg.Engine
		base.Heuristic = evict.Default
		topt := autotune.Options{Budget: out.Budget, Base: base, Workers: 1, OverheadLimit: cfg.OverheadLimit}
		if cfg.Memory != nil {
			// tune on the memory model the steps run on
			topt.Memory = func() (replay.MemoryModel, error) { return cfg.Memory(out.Budget) }
		}
		tuned, err := autotune.Tune(program, topt)
		if err != nil {
			out.Status, out.Reason = StatusError, err.Error()
			return out
		}
		out.Tuned, out.TuneWall = tuned.Best.String(), tuned.Wall
		engine = tuned.Best.Apply(cfg.Engine)
	}
	_, _ = replayOnce(tr, cfg, out.Budget, engine, false, &out)
	return out
}

// replayOnce runs one replay with a fresh memory model and fills out's
// results; an error (also recorded in out) means out is final.
func replayOnce(tr *rc.Trace, cfg Config, budget uint64, engine evict.Config, record bool, out *RunResult) (res replay.Result, err error) {
	opt := replay.Options{Budget: budget, Engine: engine, OverheadLimit: cfg.OverheadLimit, Check: cfg.Check, Record: record}
	if cfg.Memory != nil {
		m, err := cfg.Memory(budget)
		if err != nil {
			out.Status, out.Reason = StatusError, fmt.Sprintf("memory model: %v", err)
			return res, err
		}
		opt.Memory = m
		if c, ok := m.(io.Closer); ok {
			defer func() {
				if err := c.Close(); err != nil {
					out.CloseError = err.Error()
				}
			}()
		}
	}
	res, err = replay.Run(tr, opt)
	out.Memory = res.Memory
	out.Status = res.Status.String()
	out.Reason = res.Reason
	if err != nil {
		out.Status, out.Reason = StatusError, err.Error()
	}
	out.Overhead = res.Overhead
	out.Compute = res.Compute
	out.Evictions, out.EagerEvictions, out.Banished = res.Evictions, res.EagerEvictions, res.Banished
	out.Rematerializations, out.SwapsOut, out.SwapsIn = res.Rematerializations, res.SwapsOut, res.SwapsIn
	out.Peak = res.Peak
	out.VictimSearches, out.VictimSearchTime = res.VictimSearches, res.VictimSearchTime
	out.VictimSearchMean = 0
	if res.VictimSearches > 0 {
		out.VictimSearchMean = res.VictimSearchTime / time.Duration(res.VictimSearches)
	}
	out.Instructions = res.Instructions
	out.Wall += res.Wall
	out.BudgetViolated = out.Peak > out.Budget
	return res, err
}

// finishTrace fills in the frontier and the violations.
func finishTrace(t *TraceReport) {
	t.Frontier, t.Violations = nil, nil
	var pts []Point
	var idx []int
	for i := range t.Runs {
		r := &t.Runs[i]
		r.Pareto = false
		if r.BudgetViolated {
			t.Violations = append(t.Violations, i)
		}
		if r.Feasible() && !r.BudgetViolated {
			pts = append(pts, Point{Budget: float64(r.Budget), Overhead: r.Overhead})
			idx = append(idx, i)
		}
	}
	for _, k := range Frontier(pts) {
		t.Frontier = append(t.Frontier, idx[k])
		t.Runs[idx[k]].Pareto = true
	}
}
