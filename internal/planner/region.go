package planner

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"github.com/memscale/memscale/autotune"
	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/config"
	"github.com/memscale/memscale/internal/sweep"
	rc "github.com/memscale/memscale/recompute"
	"github.com/memscale/memscale/replay"
)

// The planner predicts what a memscale.dtr region does with the step, so
// its replays run the way the region's engine runs and tunes (issue 31):
//
//   - the engine configuration is the region's (evict's "defaults":
//     "region": the minimum evictee size of a region, parking on; the
//     environment ignored, as memscale.plan's report is the same on every
//     machine);
//   - rebuilds are the C ABI's plans (replay.Options.Plans), as the region
//     rebuilds;
//   - the gradients the region pins are pinned (ModelInfo.Pins: the text
//     trace format has no line for a pin);
//   - the auto policy is the region's: a first step with the default
//     heuristic recording its program, the engine's tuning of that
//     recording (autotune.EngineCandidates, plans, the region's
//     configuration: what memscale_dtr_tune runs), and the steps after it
//     with the chosen configuration, which is what is reported.

// regionRequest is the configuration memscale.dtr(budget) sends
// memscale_dtr_create (its keys with a value; see the region's _config).
const regionRequest = `{"defaults": "region", "budget": %d, "swap_bandwidth": 0, "park": true, "usage": "engine"}`

// RegionConfig returns the engine configuration a memscale.dtr region runs
// under budget (> 0) with no MEMSCALE_* variable set, its heuristic h.
func RegionConfig(budget uint64, h evict.Heuristic) (evict.Config, error) {
	pc, err := config.Load(func(string) (string, bool) { return "", false })
	if err != nil {
		return evict.Config{}, err
	}
	dh, err := evict.ParseHeuristic(string(pc.Heuristic))
	if err != nil {
		return evict.Config{}, err
	}
	d := evict.Defaults{Config: evict.Config{
		Heuristic: dh, RecompTimeFactor: pc.RecompTimeFactor, RecompMemoryFactor: pc.RecompMemoryFactor,
		EvicteeMinSize: pc.EvicteeMinSize,
	}}
	cfg, _, err := d.Decode(fmt.Appendf(nil, regionRequest, max(budget, 1)))
	if err != nil {
		return evict.Config{}, fmt.Errorf("the region's engine configuration: %w", err)
	}
	cfg.Heuristic = h
	cfg.Record = h == evict.Auto
	return cfg, nil
}

// Pin is a gradient the recorded region pinned: after the trace's line
// After, the tensor that line Line made (its output Out: the index into a
// CALL's results or a MUTATE's mutated arguments; 0 for COPY) stays
// resident for good.
type Pin struct {
	After int `json:"after_line"`
	Line  int `json:"line"`
	Out   int `json:"out"`
}

// withPins returns tr with a PIN instruction for each pin, placed after the
// last instruction at or before its line After (tr itself without pins).
func withPins(tr *rc.Trace, pins []Pin) (*rc.Trace, error) {
	if len(pins) == 0 {
		return tr, nil
	}
	made := map[int]rc.Instr{} // line -> the instruction on it
	for _, in := range tr.All() {
		made[in.Line] = in
	}
	target := make([]int32, len(pins))
	for i, p := range pins {
		in, ok := made[p.Line]
		if !ok || p.After < p.Line {
			return nil, fmt.Errorf("pin %d: line %d (after line %d) is no instruction of the trace", i, p.Line, p.After)
		}
		switch {
		case (in.Kind == rc.KindCall || in.Kind == rc.KindMutate) && p.Out >= 0 && p.Out < len(in.Outs):
			target[i] = in.Outs[p.Out].T
		case (in.Kind == rc.KindCopy || in.Kind == rc.KindConstant) && p.Out == 0:
			target[i] = in.T
		default:
			return nil, fmt.Errorf("pin %d: line %d is a %s without output %d", i, p.Line, in.Kind, p.Out)
		}
	}
	out := &rc.Trace{Names: tr.Names, Outputs: tr.Outputs, Lines: tr.Lines, StartLine: tr.StartLine,
		IgnoredReleases: tr.IgnoredReleases}
	next := 0 // pins are in order of After (the recorder writes them so)
	flush := func(upTo int) error {
		for ; next < len(pins) && pins[next].After < upTo; next++ {
			if err := out.Append(rc.Instr{Kind: rc.KindPin, T: target[next], Line: pins[next].After}); err != nil {
				return err
			}
		}
		return nil
	}
	for _, in := range tr.All() {
		if err := flush(in.Line); err != nil {
			return nil, err
		}
		if err := out.Append(in); err != nil {
			return nil, err
		}
	}
	if err := flush(int(^uint(0) >> 1)); err != nil {
		return nil, err
	}
	return out, nil
}

// regionReplay replays tr at budget as a region would run it with policy h
// (evict.Auto: the region's tuning; see the top of this file), abandoning a
// step past limit.
func regionReplay(tr *rc.Trace, h evict.Heuristic, budget uint64, ratio, limit float64) sweep.RunResult {
	out := sweep.RunResult{Heuristic: h.String(), Ratio: ratio, Budget: budget, Memory: replay.Counting{}.Name()}
	cfg, err := RegionConfig(budget, h)
	if err != nil {
		out.Status, out.Reason = sweep.StatusError, err.Error()
		return out
	}
	if h == evict.Auto {
		first, err := replay.Run(tr, replay.Options{Budget: budget, Engine: cfg, OverheadLimit: limit, Plans: true, Record: true})
		if err != nil {
			out.Status, out.Reason = sweep.StatusError, err.Error()
			return out
		}
		out.FirstStepStatus, out.FirstStepOverhead = first.Status.String(), first.Overhead
		if !first.Feasible() || first.Recording == nil {
			// the region's first step did not finish: it never tunes
			fillRun(&out, first)
			return out
		}
		base := cfg
		base.Record = false
		tuned, err := autotune.Tune(first.Recording, autotune.Options{Budget: budget, Base: base, Plans: true,
			Candidates: autotune.EngineCandidates(), Workers: 1})
		if err != nil {
			out.Status, out.Reason = sweep.StatusError, err.Error()
			return out
		}
		out.Tuned, out.TuneWall = tuned.Best.String(), tuned.Wall
		cfg = tuned.Best.Apply(base)
	}
	res, err := replay.Run(tr, replay.Options{Budget: budget, Engine: cfg, OverheadLimit: limit, Plans: true})
	if err != nil {
		out.Status, out.Reason = sweep.StatusError, err.Error()
		return out
	}
	fillRun(&out, res)
	return out
}

// fillRun copies a replay's outcome into out.
func fillRun(out *sweep.RunResult, res replay.Result) {
	out.Status, out.Reason = res.Status.String(), res.Reason
	out.Overhead, out.Compute, out.Peak = res.Overhead, res.Compute, res.Peak
	out.Evictions, out.EagerEvictions, out.Banished = res.Evictions, res.EagerEvictions, res.Banished
	out.Rematerializations, out.SwapsOut, out.SwapsIn = res.Rematerializations, res.SwapsOut, res.SwapsIn
	out.Instructions = res.Instructions
	out.Wall += res.Wall
	out.BudgetViolated = res.Peak > out.Budget
}

// regionReplays runs regionReplay at every ratio of peak on workers
// goroutines (0: GOMAXPROCS), keyed by budget.
func regionReplays(ctx context.Context, tr *rc.Trace, h evict.Heuristic, ratios []float64, peak uint64, limit float64, workers int) (map[uint64]sweep.RunResult, error) {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	res := make([]sweep.RunResult, len(ratios))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(workers, len(ratios)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				res[i] = regionReplay(tr, h, replay.Budget(ratios[i], peak), ratios[i], limit)
			}
		}()
	}
	var err error
feed:
	for i := range ratios {
		select {
		case next <- i:
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	runs := make(map[uint64]sweep.RunResult, len(res))
	for _, r := range res {
		if r.Status == sweep.StatusError {
			return nil, fmt.Errorf("replay at %d bytes: %s", r.Budget, r.Reason)
		}
		runs[r.Budget] = r
	}
	return runs, nil
}
