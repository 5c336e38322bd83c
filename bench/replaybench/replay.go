// Package replaybench replays a workload.Workload - a PyTorch memory
// snapshot, a DTR trace, an RMM log - through several allocators and
// measures, for each: peak reserved and allocated memory, fragmentation,
// device allocations, Malloc latency, throughput, the first point where it
// would have run out of memory under a limit, and reserved memory over the
// replay. It backs `memscale bench replay`.
package replaybench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/memscale/memscale/bench/workload"
)

// Options configure a replay.
type Options struct {
	// Env is the backend, the simulated card size and the limit.
	Env Env
	// TimelinePoints bounds the reserved-memory timeline (0 = 1000): the
	// replay is cut into that many buckets and each keeps its maximum.
	TimelinePoints int
	// Progress, when set, is called with the operations done so far, about
	// every 1/200 of the replay and at the end.
	Progress func(done, total int)
	// Steps replays the workload that many times in a row through the same
	// allocator (0 = 1), like the training steps of one process: whatever a
	// pass leaves live is freed at its end, and memscale's allocator is told
	// where each pass begins (StepBoundary). Result.Steps then has each
	// pass's maps, unmaps, remaps and malloc latency; the timeline and the
	// first OOM are the first pass's, the other columns cover every pass.
	Steps int
}

// StepResult is what one pass of a replay of several steps cost.
type StepResult struct {
	// Maps, Unmaps and Remaps are the granules mapped, unmapped and
	// remapped during the pass (memscale with expandable segments).
	Maps   int64 `json:"maps"`
	Unmaps int64 `json:"unmaps"`
	Remaps int64 `json:"remaps"`
	// MallocP99 is the pass's malloc latency, 99th percentile.
	MallocP99 time.Duration `json:"malloc_p99_ns"`
}

// Point is one sample of the timeline.
type Point struct {
	// Op is the index of the operation (the bucket's last).
	Op int `json:"op"`
	// Reserved is the most reserved memory in the bucket.
	Reserved uint64 `json:"reserved"`
}

// OOM is where an allocator first ran out of memory under the limit.
type OOM struct {
	// Op is the index of the failing allocation in the workload.
	Op int `json:"op"`
	// Fraction is Op / number of operations.
	Fraction float64 `json:"fraction"`
	// Size is the request that failed.
	Size uint64 `json:"size"`
	// Requested is the bytes live (as requested) just before it.
	Requested uint64 `json:"requested"`
}

// Result is one allocator's replay of one workload.
type Result struct {
	// Workload and Allocator name the pair; Describe says what the
	// allocator is; Backend is where it ran (sim or cuda).
	Workload  string `json:"workload"`
	Allocator string `json:"allocator"`
	Describe  string `json:"describe"`
	Backend   string `json:"backend"`
	// Ops, Mallocs and Frees count the operations replayed.
	Ops     int `json:"ops"`
	Mallocs int `json:"mallocs"`
	Frees   int `json:"frees"`
	// PeakRequested is the workload's own peak of live requested bytes.
	PeakRequested uint64 `json:"peak_requested"`
	// PeakAllocated and PeakReserved are the allocator's peaks of bytes in
	// allocated blocks and of bytes held from the device.
	PeakAllocated uint64 `json:"peak_allocated"`
	PeakReserved  uint64 `json:"peak_reserved"`
	// Fragmentation is 1 - peak allocated / peak reserved (GMLake's measure).
	Fragmentation float64 `json:"fragmentation"`
	// Overhead is 1 - peak requested / peak reserved (rounding included).
	Overhead float64 `json:"overhead"`
	// DeviceAllocs counts physical allocations from the device (Counters).
	DeviceAllocs int64 `json:"device_allocs"`
	// Maps, Unmaps and Remaps are the granules mapped, unmapped and remapped
	// (memscale with expandable segments; Mapping false and 0 otherwise).
	Mapping bool  `json:"mapping"`
	Maps    int64 `json:"maps"`
	Unmaps  int64 `json:"unmaps"`
	Remaps  int64 `json:"remaps"`
	// MallocP50, MallocP99 and MallocMax are the latency of Malloc calls.
	MallocP50 time.Duration `json:"malloc_p50_ns"`
	MallocP99 time.Duration `json:"malloc_p99_ns"`
	MallocMax time.Duration `json:"malloc_max_ns"`
	// OpsPerSec is Malloc and Free calls per second of time spent in them.
	OpsPerSec float64 `json:"ops_per_sec"`
	// Limit is the limit replayed under (0 = none); OOM the first failure
	// under it (nil = none). After a failure the limit is lifted and the
	// replay goes on, so the peaks are those of the whole workload.
	Limit uint64 `json:"limit"`
	OOM   *OOM   `json:"oom"`
	// Timeline is reserved memory over the replay (bucket maxima).
	Timeline []Point `json:"timeline,omitempty"`
	// Steps has one entry per pass when Options.Steps > 1.
	Steps []StepResult `json:"steps,omitempty"`
	// Error is set when the replay could not finish (the columns above are
	// then partial).
	Error string `json:"error,omitempty"`
}

// Run replays w through each spec in turn.
func Run(ctx context.Context, w *workload.Workload, specs []Spec, opt Options) ([]Result, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	var out []Result
	for _, s := range specs {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		r, err := RunOne(ctx, w, s, opt)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// RunOne replays w through one allocator. An allocator that cannot be built
// is an error; one that fails during the replay gives a Result with Error.
func RunOne(ctx context.Context, w *workload.Workload, s Spec, opt Options) (Result, error) {
	res := Result{Workload: w.Name, Allocator: s.Name, Describe: s.Describe, Backend: string(opt.Env.Backend), Ops: len(w.Ops), Limit: opt.Env.Limit}
	if res.Backend == "" {
		res.Backend = string(BackendSim)
	}
	res.PeakRequested = w.PeakRequested()
	a, err := s.New(opt.Env)
	if err != nil {
		return res, fmt.Errorf("allocator %s: %w", s.Name, err)
	}
	runErr := replaySteps(ctx, w, a, opt, &res)
	c := a.Counters()
	res.PeakAllocated, res.PeakReserved, res.DeviceAllocs = c.PeakAllocated, c.PeakReserved, c.DeviceAllocs
	res.Mapping, res.Maps, res.Unmaps, res.Remaps = c.Mapping, c.Maps, c.Unmaps, c.Remaps
	if res.PeakReserved > 0 {
		res.Fragmentation = 1 - float64(res.PeakAllocated)/float64(res.PeakReserved)
		res.Overhead = 1 - float64(res.PeakRequested)/float64(res.PeakReserved)
	}
	if cerr := a.Close(); cerr != nil && runErr == nil {
		runErr = fmt.Errorf("closing: %w", cerr)
	}
	if runErr != nil {
		if errors.Is(runErr, context.Canceled) {
			return res, runErr
		}
		res.Error = runErr.Error()
	}
	return res, nil
}

// stepper is an allocator that can be told where steps begin.
type stepper interface{ StepBoundary() }

// replaySteps replays w opt.Steps times (at least once); see Options.Steps.
func replaySteps(ctx context.Context, w *workload.Workload, a Allocator, opt Options, res *Result) error {
	steps := max(opt.Steps, 1)
	if steps == 1 {
		return replay(ctx, w, a, opt, res, nil)
	}
	var all []time.Duration
	var busy time.Duration
	prev := a.Counters()
	for i := 0; i < steps; i++ {
		if s, ok := a.(stepper); ok {
			s.StepBoundary()
		}
		pass := *res
		pass.Timeline, pass.OOM = nil, nil
		var ps passStats
		o := opt
		if i > 0 {
			o.Progress = nil
			o.Env.Limit = 0 // the first pass reports the OOM
		}
		if err := replay(ctx, w, a, o, &pass, &ps); err != nil {
			return fmt.Errorf("step %d: %w", i+1, err)
		}
		if i == 0 {
			res.Timeline, res.OOM = pass.Timeline, pass.OOM
		}
		res.Mallocs, res.Frees = pass.Mallocs, pass.Frees
		busy += ps.busy
		lat := ps.lat
		c := a.Counters()
		st := StepResult{Maps: c.Maps - prev.Maps, Unmaps: c.Unmaps - prev.Unmaps, Remaps: c.Remaps - prev.Remaps}
		if len(lat) > 0 {
			slices.Sort(lat)
			st.MallocP99 = lat[min(len(lat)-1, len(lat)*99/100)]
		}
		res.Steps = append(res.Steps, st)
		all = append(all, lat...)
		prev = c
	}
	if busy > 0 {
		res.OpsPerSec = float64(res.Mallocs+res.Frees) / busy.Seconds()
	}
	if len(all) > 0 {
		slices.Sort(all)
		res.MallocP50 = all[len(all)/2]
		res.MallocP99 = all[min(len(all)-1, len(all)*99/100)]
		res.MallocMax = all[len(all)-1]
	}
	return nil
}

// passStats is what replaySteps needs of one pass: its malloc latencies and
// the time spent in Malloc and Free.
type passStats struct {
	lat  []time.Duration
	busy time.Duration
}

// replay replays w once, adding to res's counts. When ps is not nil it
// receives the pass's latencies and busy time.
func replay(ctx context.Context, w *workload.Workload, a Allocator, opt Options, res *Result, ps *passStats) error {
	points := opt.TimelinePoints
	if points <= 0 {
		points = 1000
	}
	n := len(w.Ops)
	bucket := max(1, (n+points-1)/points)
	every := max(1, n/200)
	addrs := make([]uint64, w.Allocs)
	lat := make([]time.Duration, 0, w.Allocs)
	var busy time.Duration
	var live, bucketMax uint64
	for i, op := range w.Ops {
		if i%every == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			if opt.Progress != nil {
				opt.Progress(i, n)
			}
		}
		if op.Free {
			t0 := time.Now()
			err := a.Free(addrs[op.ID])
			busy += time.Since(t0)
			if err != nil {
				return fmt.Errorf("op %d: free of allocation %d: %w", i, op.ID, err)
			}
			live -= op.Size
			res.Frees++
		} else {
			t0 := time.Now()
			p, err := a.Malloc(op.Size, op.Stream)
			d := time.Since(t0)
			if err != nil && res.OOM == nil && opt.Env.Limit > 0 {
				res.OOM = &OOM{Op: i, Fraction: float64(i) / float64(n), Size: op.Size, Requested: live}
				if lerr := a.SetLimit(0); lerr != nil {
					return fmt.Errorf("op %d: lifting the limit after the first OOM: %w", i, lerr)
				}
				t0 = time.Now()
				p, err = a.Malloc(op.Size, op.Stream)
				d += time.Since(t0)
			}
			busy += d
			if err != nil {
				return fmt.Errorf("op %d: malloc of %d bytes (allocation %d): %w", i, op.Size, op.ID, err)
			}
			lat = append(lat, d)
			addrs[op.ID] = p
			live += op.Size
			res.Mallocs++
		}
		bucketMax = max(bucketMax, a.Reserved())
		if (i+1)%bucket == 0 || i == n-1 {
			res.Timeline = append(res.Timeline, Point{Op: i, Reserved: bucketMax})
			bucketMax = 0
		}
	}
	if opt.Progress != nil {
		opt.Progress(n, n)
	}
	if busy > 0 {
		res.OpsPerSec = float64(res.Mallocs+res.Frees) / busy.Seconds()
	}
	if ps != nil {
		ps.lat, ps.busy = slices.Clone(lat), busy
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		res.MallocP50 = lat[len(lat)/2]
		res.MallocP99 = lat[min(len(lat)-1, len(lat)*99/100)]
		res.MallocMax = lat[len(lat)-1]
	}
	// Free what is still live, so that the allocator closes clean.
	freed := make([]bool, w.Allocs)
	for _, op := range w.Ops {
		if op.Free {
			freed[op.ID] = true
		}
	}
	for id, f := range freed {
		if !f {
			if err := a.Free(addrs[id]); err != nil {
				return fmt.Errorf("freeing allocation %d at the end: %w", id, err)
			}
		}
	}
	return nil
}
