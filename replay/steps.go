package replay

import (
	"fmt"
	"slices"
	"time"

	"github.com/memscale/memscale/allocator"
	rc "github.com/memscale/memscale/recompute"
)

// AllocatorStep is what one training step of RunAllocatorSteps cost the
// allocator: the driver work of the step (granules mapped, unmapped and
// moved) and its memory, read from the allocator's statistics.
type AllocatorStep struct {
	// Result is the replay of the step.
	Result Result `json:"result"`
	// Maps, Unmaps and Remaps are the granules mapped, unmapped, and moved
	// from cached free memory to where a request needed them during the step
	// (num_map, num_unmap and num_remap deltas).
	Maps   int64 `json:"maps"`
	Unmaps int64 `json:"unmaps"`
	Remaps int64 `json:"remaps"`
	// MapCalls is the number of driver map calls (MapRange) of the step.
	MapCalls int64 `json:"map_calls"`
	// Mapped is the bytes mapped at the end of the step; MappedGranules the
	// same in granules (0 without VMM).
	Mapped         uint64 `json:"mapped"`
	MappedGranules int64  `json:"mapped_granules"`
	// PeakReserved is the most memory held during the step.
	PeakReserved uint64 `json:"peak_reserved"`
	// PeakAllocated is the most memory in live blocks during the step.
	PeakAllocated uint64 `json:"peak_allocated"`
	// Mallocs is the number of Malloc calls of the step; MallocP50,
	// MallocP99 and MallocMax their latency.
	Mallocs   int           `json:"mallocs"`
	MallocP50 time.Duration `json:"malloc_p50_ns"`
	MallocP99 time.Duration `json:"malloc_p99_ns"`
	MallocMax time.Duration `json:"malloc_max_ns"`
}

// RemapShare is the granules remapped in the step over the granules mapped
// at its end (0 when nothing is mapped).
func (s AllocatorStep) RemapShare() float64 {
	if s.MappedGranules <= 0 {
		return 0
	}
	return float64(s.Remaps) / float64(s.MappedGranules)
}

// RunAllocatorSteps replays tr steps times in a row through the allocator a,
// like the training steps of one process: each step is a whole replay under
// opt (a fresh engine whose usage is a's allocated bytes), every storage is
// freed at its end, and a keeps its cache from one step to the next. It
// returns what each step cost the allocator. opt.Memory is ignored. A step
// that does not finish (out of memory, over the overhead limit) ends the run
// with its result in the last entry.
func RunAllocatorSteps(tr *rc.Trace, opt Options, a *allocator.Allocator, steps int) ([]AllocatorStep, error) {
	return RunAllocatorStepsWith(tr, opt, a, steps, StepOptions{})
}

// StepOptions are RunAllocatorStepsWith's choices.
type StepOptions struct {
	// Boundaries calls the allocator's StepBoundary before each step, as a
	// training loop that tells the allocator where its steps begin (step
	// plans: allocator/plan.go).
	Boundaries bool
}

// RunAllocatorStepsWith is RunAllocatorSteps with options.
func RunAllocatorStepsWith(tr *rc.Trace, opt Options, a *allocator.Allocator, steps int, so StepOptions) ([]AllocatorStep, error) {
	if steps <= 0 {
		return nil, fmt.Errorf("replay: %d steps: want at least 1", steps)
	}
	m := NewAllocatorModel(a)
	m.lat = make([]time.Duration, 0, 1024)
	opt.Memory = m
	var out []AllocatorStep
	prev := a.Stats()
	for i := 0; i < steps; i++ {
		if so.Boundaries {
			a.StepBoundary()
		}
		a.ResetPeakStats()
		m.lat = m.lat[:0]
		res, err := Run(tr, opt)
		if err != nil {
			return out, fmt.Errorf("replay: step %d: %w", i+1, err)
		}
		st := a.Stats()
		s := AllocatorStep{
			Result:        res,
			Maps:          st["num_map"] - prev["num_map"],
			Unmaps:        st["num_unmap"] - prev["num_unmap"],
			Remaps:        st["num_remap"] - prev["num_remap"],
			MapCalls:      st["num_map_calls"] - prev["num_map_calls"],
			Mapped:        uint64(st["mapped_bytes"]),
			PeakReserved:  uint64(st["reserved_bytes.all.peak"]),
			PeakAllocated: uint64(st["allocated_bytes.all.peak"]),
			Mallocs:       len(m.lat),
		}
		if g := st["granularity_bytes"]; g > 0 {
			s.MappedGranules = st["mapped_bytes"] / g
		}
		if n := len(m.lat); n > 0 {
			slices.Sort(m.lat)
			s.MallocP50 = m.lat[n/2]
			s.MallocP99 = m.lat[min(n-1, n*99/100)]
			s.MallocMax = m.lat[n-1]
		}
		out = append(out, s)
		prev = st
		if !res.Feasible() {
			break
		}
	}
	return out, nil
}
