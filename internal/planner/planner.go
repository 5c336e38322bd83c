// Package planner answers "will this training step fit on that GPU, and at
// what cost" from a recorded step (a DTR trace, or a PyTorch memory
// snapshot): the step's peak with no eviction, a static placement of every
// storage (package placement; its arena against the peak is the
// fragmentation floor), the least budget DTR runs it in, the overhead of
// DTR against the budget (engine replays, package sweep), budgets and
// devices checked, and a recommendation in words. `memscale plan` and
// memscale.plan (Python) print its Report.
package planner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/placement"
	"github.com/memscale/memscale/internal/sweep"
	rc "github.com/memscale/memscale/recompute"
	"github.com/memscale/memscale/replay"
)

// Align is the size rounding of the static placement: PyTorch's caching
// allocator rounds every block to 512 bytes.
const Align = 512

// ModelInfo is what the recorder knows about the step beyond the trace
// (memscale.plan writes it; every field is optional).
type ModelInfo struct {
	// Model names the model ("LlamaForCausalLM").
	Model string `json:"model,omitempty"`
	// BatchSize is the batch the step was recorded at (0 = unknown).
	BatchSize int `json:"batch_size,omitempty"`
	// Parameters, Gradients and OptimizerState are bytes.
	Parameters     uint64 `json:"parameters_bytes"`
	Gradients      uint64 `json:"gradients_bytes"`
	OptimizerState uint64 `json:"optimizer_state_bytes"`
	// OptimizerStepPeak is the peak of optimizer.step() (parameters,
	// gradients, state and its temporaries): it runs outside DTR.
	OptimizerStepPeak uint64 `json:"optimizer_step_peak_bytes"`
	// Costs says where the trace's op times come from ("measured on cpu",
	// "estimated for h100: FLOPs and bytes moved").
	Costs string `json:"costs,omitempty"`
	// RecordedOn is the device the step was recorded on ("meta", "cpu").
	RecordedOn string `json:"recorded_on,omitempty"`
	// Pins are the gradients the recorded region pinned (the trace's text
	// format has no line for a pin); the replays pin them where it did.
	Pins []Pin `json:"pins,omitempty"`
}

// Budget is a memory budget the user tracks ("24GiB"): the type memscale
// replay's --budgets uses too.
type Budget = sweep.Budget

// Options configure Analyze.
type Options struct {
	// Ratios of the trace's peak at which DTR is replayed for the frontier
	// (nil: 0.1, 0.2, ..., 0.9).
	Ratios []float64
	// Budgets are tracked (violates_<label>); Active, when set, accepts or
	// rejects every variant.
	Budgets []Budget
	Active  *Budget
	// Devices are checked: does the step fit natively, and under DTR at
	// what overhead.
	Devices []Device
	// Heuristic is the engine's policy for the replays (0: auto): Auto is
	// the region's (its first step recorded and tuned, region.go), any
	// other is run as given; every replay runs the region's engine
	// configuration and rebuilds (RegionConfig, replay.Options.Plans).
	Heuristic evict.Heuristic
	// OverheadLimit abandons a replay past it (0: replay's default, 2x).
	OverheadLimit float64
	// MaxOverhead is what the active budget accepts (0: 1.3).
	MaxOverhead float64
	// Workers replay in parallel (0: GOMAXPROCS).
	Workers int
	// NoPlacement skips the static placement (large snapshots).
	NoPlacement bool
}

// DefaultMaxOverhead is the overhead an active budget accepts by default.
const DefaultMaxOverhead = 1.3

// Analyze plans one recorded step. name labels it; info may be zero.
func Analyze(ctx context.Context, name string, tr *rc.Trace, info ModelInfo, opt Options) (*Report, error) {
	if opt.MaxOverhead == 0 {
		opt.MaxOverhead = DefaultMaxOverhead
	}
	if opt.Heuristic == 0 {
		opt.Heuristic = evict.Auto
	}
	rep := &Report{Name: name, Source: "dtr-trace", Info: info, MaxOverhead: opt.MaxOverhead}
	tr, err := withPins(tr, info.Pins)
	if err != nil {
		return nil, fmt.Errorf("plan %s: %w", name, err)
	}

	// The baseline: the schedule's lifetimes, peak, compute, lower bound
	// (the region's: its minimum evictee size, the pinned gradients).
	cfg, err := RegionConfig(0, evict.Default)
	if err != nil {
		return nil, fmt.Errorf("plan %s: %w", name, err)
	}
	life := &lifetimes{}
	base, err := replay.Run(tr, replay.Options{OverheadLimit: -1, Memory: life, Engine: cfg})
	if err != nil {
		return nil, fmt.Errorf("plan %s: baseline replay: %w", name, err)
	}
	if base.Status != replay.OK {
		return nil, fmt.Errorf("plan %s: baseline replay ended %s: %s", name, base.Status, base.Reason)
	}
	m := &rep.Memory
	m.TracePeak = life.peak
	m.Constants = constantBytes(tr)
	m.MinBudgetLowerBound = base.MinBudget + info.OptimizerState
	rep.StepNS = base.BaseCompute
	m.Peak = max(m.TracePeak+info.OptimizerState, info.OptimizerStepPeak)
	if !opt.NoPlacement {
		if err := rep.place(life.buffers()); err != nil {
			return nil, fmt.Errorf("plan %s: %w", name, err)
		}
	}

	// The least budget DTR finishes in, by bisection with the default
	// heuristic, then the sweep.
	minTrace, err := minFeasible(tr, base.MinBudget, m.TracePeak, opt.OverheadLimit)
	if err != nil {
		return nil, fmt.Errorf("plan %s: %w", name, err)
	}
	m.MinFeasibleBudget = max(minTrace+info.OptimizerState, info.OptimizerStepPeak)

	ratios := opt.Ratios
	if ratios == nil {
		ratios = sweep.DefaultRatios()
	}
	extra := info.OptimizerState
	want := map[float64]bool{}
	for _, r := range ratios {
		want[r] = true
	}
	asRatio := func(total uint64) (float64, bool) {
		if total <= extra || total < info.OptimizerStepPeak {
			return 0, false
		}
		r := float64(total-extra) / float64(m.TracePeak)
		if r >= 1 {
			return 0, false
		}
		want[r] = true
		return r, true
	}
	if mr := float64(minTrace) / float64(m.TracePeak); mr > 0 && mr < 1 {
		want[mr] = true
	}
	for _, b := range opt.Budgets {
		asRatio(b.Bytes)
	}
	if opt.Active != nil {
		asRatio(opt.Active.Bytes)
	}
	for _, d := range opt.Devices {
		asRatio(d.Usable())
	}
	all := make([]float64, 0, len(want))
	for r := range want {
		all = append(all, r)
	}
	slices.Sort(all)
	runs := map[uint64]sweep.RunResult{}
	if len(all) > 0 {
		limit := opt.OverheadLimit
		if limit == 0 {
			limit = replay.DefaultOverheadLimit
		}
		runs, err = regionReplays(ctx, tr, opt.Heuristic, all, m.TracePeak, limit, opt.Workers)
		if err != nil {
			return nil, fmt.Errorf("plan %s: DTR replays: %w", name, err)
		}
	}
	rep.fill(runs, opt)
	return rep, nil
}

// constantBytes is the bytes of the trace's CONSTANT tensors (parameters
// and inputs).
func constantBytes(tr *rc.Trace) uint64 {
	var n uint64
	for _, in := range tr.All() {
		if in.Kind == rc.KindConstant {
			n += in.Size
		}
	}
	return n
}

// place runs the static placement of the storages' lifetimes.
func (r *Report) place(bufs []placement.Buffer) error {
	p, err := placement.Place(bufs, Align)
	if err != nil {
		return fmt.Errorf("static placement: %w", err)
	}
	r.Memory.Arena = p.Arena + r.Info.OptimizerState
	r.Memory.AlignedPeak = p.Peak + r.Info.OptimizerState
	r.Memory.FragmentationFloor = p.Fragmentation()
	r.Memory.Storages = len(bufs)
	return nil
}

// bisectionSteps bounds the feasibility search: 2^-12 of the range.
const bisectionSteps = 12

// minFeasible returns the least budget (bytes of the trace) under which a
// replay with the default heuristic (the region's first step) finishes
// within the overhead limit, searched between the engine's lower bound and
// the peak.
func minFeasible(tr *rc.Trace, lower, peak uint64, limit float64) (uint64, error) {
	run := func(b uint64) (bool, error) {
		cfg, err := RegionConfig(b, evict.Default)
		if err != nil {
			return false, err
		}
		res, err := replay.Run(tr, replay.Options{Budget: b, Engine: cfg, OverheadLimit: limit, Plans: true})
		if err != nil {
			return false, fmt.Errorf("replay at %d bytes: %w", b, err)
		}
		return res.Feasible(), nil
	}
	lo, hi := max(lower, 1), peak // hi is feasible (nothing evicted)
	if ok, err := run(lo); err != nil || ok {
		return lo, err
	}
	for range bisectionSteps {
		if hi-lo <= max(peak/4096, Align) {
			break
		}
		mid := lo + (hi-lo)/2
		ok, err := run(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}

// ErrNoTrace is returned when a plan needs a DTR trace (the DTR parts of a
// snapshot's plan).
var ErrNoTrace = errors.New("a PyTorch snapshot has allocations but no ops: DTR needs a trace recorded by memscale.plan or memscale.trace")

// ratioOf is budget/peak, or +Inf for an empty peak.
func ratioOf(budget, peak uint64) float64 {
	if peak == 0 {
		return math.Inf(1)
	}
	return float64(budget) / float64(peak)
}
