package planner

import (
	"fmt"
	"sort"
	"strings"

	"github.com/memscale/memscale/internal/sweep"
	"github.com/memscale/memscale/replay"
)

// MemoryReport is the step's memory, in bytes. Totals include the
// optimizer's state, which the trace (forward and backward) does not see.
type MemoryReport struct {
	// Constants is the trace's CONSTANT tensors: parameters and inputs.
	Constants uint64 `json:"constants_bytes"`
	// TracePeak is the recorded forward and backward's peak with nothing
	// evicted (the trace's storages only).
	TracePeak uint64 `json:"trace_peak_bytes"`
	// Peak is the step's peak with no eviction: TracePeak plus the
	// optimizer's state, or the optimizer step's own peak if higher.
	Peak uint64 `json:"peak_bytes"`
	// Storages, Arena, AlignedPeak and FragmentationFloor are the static
	// placement's: storages placed, the arena they need (sizes rounded to
	// 512 bytes), the peak of the rounded sizes, and arena/aligned peak - 1.
	Storages           int     `json:"storages"`
	Arena              uint64  `json:"arena_bytes"`
	AlignedPeak        uint64  `json:"aligned_peak_bytes"`
	FragmentationFloor float64 `json:"fragmentation_floor"`
	// MinBudgetLowerBound is the engine's lower bound (pinned bytes and the
	// largest op's working set); MinFeasibleBudget the least budget a
	// replay with the default heuristic finished in (bisection).
	MinBudgetLowerBound uint64 `json:"min_budget_lower_bound_bytes"`
	MinFeasibleBudget   uint64 `json:"min_feasible_budget_bytes"`
}

// Point is one variant of the step: natively (no eviction) or DTR under a
// budget. Budgets and peaks are totals (the optimizer's state included).
type Point struct {
	// Variant is "native" or "dtr".
	Variant string `json:"variant"`
	// Budget is the DTR budget (0 for native), Ratio its share of the
	// trace's peak.
	Budget uint64  `json:"budget_bytes"`
	Ratio  float64 `json:"ratio"`
	// Status is the replay's ("ok", "oom", "over-limit", "error").
	Status string `json:"status"`
	// Overhead is compute / the step's compute (estimated step time ratio).
	Overhead float64 `json:"overhead"`
	// Peak is the memory the variant used.
	Peak uint64 `json:"peak_bytes"`
	// Heuristic, Evictions and Rematerializations are the replay's.
	Heuristic          string `json:"heuristic,omitempty"`
	Evictions          int64  `json:"evictions"`
	Rematerializations int64  `json:"rematerializations"`
	// Violates holds violates_<label> for each tracked budget: Peak over
	// it, or the variant did not finish.
	Violates map[string]bool `json:"violates"`
	// Accepted is set when an active budget is: the variant finished, fits
	// it and is within the accepted overhead.
	Accepted *bool `json:"accepted,omitempty"`
	// Pareto marks the accepted (or, with no active budget, feasible)
	// variants no other beats on both memory and overhead.
	Pareto bool `json:"pareto"`
}

// Fit is a budget (tracked, active or a device's usable memory) checked:
// natively, and under DTR.
type Fit struct {
	// Label names the budget ("24GiB", "h100").
	Label string `json:"label"`
	// Budget is the bytes available.
	Budget uint64 `json:"budget_bytes"`
	// Native is set when the step fits with no eviction.
	Native bool `json:"fits_natively"`
	// Status is DTR's at this budget ("ok" when native), with Overhead.
	Status   string  `json:"dtr_status"`
	Overhead float64 `json:"overhead"`
	// Profile is safe (fits natively), balanced (DTR within the accepted
	// overhead), memory (DTR, more overhead) or infeasible.
	Profile string `json:"profile"`
	// Device is set for a device check.
	Device *Device `json:"device,omitempty"`
}

// Report is the plan of one step.
type Report struct {
	// Name labels the step; Source is "dtr-trace" or "torch-snapshot".
	Name   string    `json:"name"`
	Source string    `json:"source"`
	Info   ModelInfo `json:"model"`
	// Memory is the memory analysis.
	Memory MemoryReport `json:"memory"`
	// StepNS is the step's compute in ns (the trace's op times: measured,
	// or the cost model's estimate - Info.Costs says which).
	StepNS int64 `json:"step_ns"`
	// Variants are native and every DTR replay, by budget.
	Variants []Point `json:"variants"`
	// Budgets, Active and Devices are the checks asked for.
	Budgets []Fit `json:"budgets"`
	Active  *Fit  `json:"active_budget,omitempty"`
	Devices []Fit `json:"devices"`
	// MaxOverhead is what the active budget and the balanced profile accept.
	MaxOverhead float64 `json:"max_overhead"`
	// Summary is the recommendation in words.
	Summary string `json:"summary"`
}

// fill builds the variants and checks from the DTR runs (keyed by their
// trace budget).
func (r *Report) fill(runs map[uint64]sweep.RunResult, opt Options) {
	m, extra := &r.Memory, r.Info.OptimizerState
	native := Point{Variant: "native", Status: "ok", Overhead: 1, Peak: m.Peak, Ratio: 1}
	r.Variants = append(r.Variants, native)
	keys := make([]uint64, 0, len(runs))
	for k := range runs {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(a, b int) bool { return keys[a] < keys[b] })
	for _, k := range keys {
		run := runs[k]
		r.Variants = append(r.Variants, Point{
			Variant: "dtr", Budget: run.Budget + extra, Ratio: run.Ratio, Status: run.Status, Overhead: run.Overhead,
			Peak: max(run.Peak+extra, r.Info.OptimizerStepPeak), Heuristic: sweep.HeuristicCell(&run),
			Evictions: run.Evictions, Rematerializations: run.Rematerializations,
		})
	}
	check := func(label string, budget uint64) Fit {
		f := Fit{Label: label, Budget: budget, Status: "infeasible", Profile: "infeasible"}
		switch {
		case m.Peak <= budget:
			f.Native, f.Status, f.Overhead, f.Profile = true, "ok", 1, "safe"
			return f
		case budget <= extra || budget < r.Info.OptimizerStepPeak:
			f.Status = "oom"
			return f
		}
		ratio := float64(budget-extra) / float64(m.TracePeak)
		run, ok := runs[replay.Budget(ratio, m.TracePeak)]
		if !ok {
			return f
		}
		f.Status, f.Overhead = run.Status, run.Overhead
		switch {
		case !run.Feasible():
		case run.Overhead <= r.MaxOverhead:
			f.Profile = "balanced"
		default:
			f.Profile = "memory"
		}
		return f
	}
	for _, b := range opt.Budgets {
		r.Budgets = append(r.Budgets, check(b.Label, b.Bytes))
	}
	if opt.Active != nil {
		a := check(opt.Active.Label, opt.Active.Bytes)
		r.Active = &a
	}
	for _, d := range opt.Devices {
		f := check(d.Key, d.Usable())
		f.Device = &d
		r.Devices = append(r.Devices, f)
	}
	r.flag(opt)
	r.Summary = r.words()
}

// flag sets each variant's violates_<label>, accepted and Pareto marks.
func (r *Report) flag(opt Options) {
	var pts []sweep.Point
	var idx []int
	for i := range r.Variants {
		v := &r.Variants[i]
		v.Violates = map[string]bool{}
		for _, b := range opt.Budgets {
			v.Violates["violates_"+b.Label] = v.Status != "ok" || v.Peak > b.Bytes
		}
		ok := v.Status == "ok"
		if opt.Active != nil {
			acc := ok && v.Peak <= opt.Active.Bytes && v.Overhead <= r.MaxOverhead
			v.Accepted = &acc
			ok = acc
		}
		if ok {
			pts = append(pts, sweep.Point{Budget: float64(v.Peak), Overhead: v.Overhead})
			idx = append(idx, i)
		}
	}
	for _, k := range sweep.Frontier(pts) {
		r.Variants[idx[k]].Pareto = true
	}
}

// overheadAt is the overhead of the DTR variant closest to ratio of the
// trace's peak that finished (0 if none did).
func (r *Report) overheadAt(ratio float64) (float64, uint64) {
	best, bestD, budget := 0.0, 2.0, uint64(0)
	for _, v := range r.Variants {
		if v.Variant != "dtr" || v.Status != "ok" {
			continue
		}
		if d := abs(v.Ratio - ratio); d < bestD {
			best, bestD, budget = v.Overhead, d, v.Budget
		}
	}
	return best, budget
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// fb formats bytes.
func fb(n uint64) string { return sweep.FormatBytes(n) }

// words is the summary and the recommendation.
func (r *Report) words() string {
	m := &r.Memory
	var s strings.Builder
	what := r.Name
	if r.Info.Model != "" {
		what = r.Info.Model
	}
	if r.Info.BatchSize > 0 {
		what += fmt.Sprintf(" batch %d", r.Info.BatchSize)
	}
	fmt.Fprintf(&s, "%s needs %s natively", what, fb(m.Peak))
	if r.Info.Parameters > 0 {
		fmt.Fprintf(&s, " (parameters %s, gradients %s, optimizer state %s, the rest activations and temporaries)",
			fb(r.Info.Parameters), fb(r.Info.Gradients), fb(r.Info.OptimizerState))
	}
	if m.Arena > 0 {
		fmt.Fprintf(&s, "; a static placement of its %d storages needs %s (fragmentation floor %.1f %%)",
			m.Storages, fb(m.Arena), 100*m.FragmentationFloor)
	}
	fmt.Fprintf(&s, ". Under memscale it runs in as little as %s", fb(m.MinFeasibleBudget))
	if o, b := r.overheadAt(0.5); o > 0 {
		fmt.Fprintf(&s, "; at %s (half the activations' peak) the step takes an estimated %.2fx", fb(b), o)
	}
	s.WriteString(".")
	targets := r.Devices
	if r.Active != nil {
		targets = append(targets, *r.Active)
	}
	for _, f := range targets {
		where := "within " + f.Label
		if f.Device != nil {
			where = fmt.Sprintf("on an %s (%s usable)", f.Device.Name, fb(f.Budget))
		}
		switch f.Profile {
		case "safe":
			fmt.Fprintf(&s, " %s it fits natively with %s to spare; profile: safe.", capital(where), fb(f.Budget-m.Peak))
		case "balanced", "memory":
			fmt.Fprintf(&s, " %s memscale fits it at budget %s with an estimated %.2fx step time; profile: %s.",
				capital(where), fb(f.Budget), f.Overhead, f.Profile)
		default:
			fmt.Fprintf(&s, " %s it does not fit, even under memscale (it needs at least %s).", capital(where), fb(m.MinFeasibleBudget))
		}
	}
	if r.Info.Costs != "" {
		fmt.Fprintf(&s, " Step times: %s.", r.Info.Costs)
	}
	return s.String()
}

func capital(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
