package allocbench

import (
	"fmt"
	"time"

	"github.com/memscale/memscale/allocator"
	"github.com/memscale/memscale/device"
)

// Result is what one replay measured.
type Result struct {
	// Allocs and Frees are the operations replayed.
	Allocs, Frees int
	// PeakRequested is the peak of bytes asked for (sum of live storage sizes).
	PeakRequested uint64
	// PeakAllocated is allocated_bytes.all.peak: live blocks after rounding.
	PeakAllocated uint64
	// PeakReserved is reserved_bytes.all.peak: memory mapped in segments.
	PeakReserved uint64
	// Elapsed is the time spent in Malloc and Free.
	Elapsed time.Duration
	// Stats are the allocator's statistics at the end.
	Stats allocator.Stats
}

// Fragmentation is 1 - peak allocated / peak reserved (GMLake's measure).
func (r Result) Fragmentation() float64 {
	if r.PeakReserved == 0 {
		return 0
	}
	return 1 - float64(r.PeakAllocated)/float64(r.PeakReserved)
}

// Overhead is 1 - peak requested / peak reserved: all the memory the
// allocator needs beyond what was asked for, rounding inside blocks
// included.
func (r Result) Overhead() float64 {
	if r.PeakReserved == 0 {
		return 0
	}
	return 1 - float64(r.PeakRequested)/float64(r.PeakReserved)
}

// OpsPerSec is the Malloc and Free calls per second.
func (r Result) OpsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Allocs+r.Frees) / r.Elapsed.Seconds()
}

// Replay runs the events of tr through a, all on stream s, and frees what is
// still live at the end. The allocator should be fresh (its peaks are read).
func Replay(a *allocator.Allocator, tr *Trace, s device.Stream) (Result, error) {
	var res Result
	ptrs := make([]device.Ptr, tr.Storages)
	sizes := make([]uint64, tr.Storages)
	var live uint64
	start := time.Now()
	for i, ev := range tr.Events {
		if ev.Free {
			if err := a.Free(ptrs[ev.ID]); err != nil {
				return res, fmt.Errorf("allocbench: event %d: free of storage %d: %w", i, ev.ID, err)
			}
			ptrs[ev.ID] = 0
			live -= sizes[ev.ID]
			res.Frees++
			continue
		}
		p, err := a.Malloc(ev.Size, s)
		if err != nil {
			return res, fmt.Errorf("allocbench: event %d: malloc of storage %d (%d bytes): %w", i, ev.ID, ev.Size, err)
		}
		ptrs[ev.ID] = p
		sizes[ev.ID] = ev.Size
		live += ev.Size
		res.PeakRequested = max(res.PeakRequested, live)
		res.Allocs++
	}
	res.Elapsed = time.Since(start)
	res.Stats = a.Stats()
	res.PeakAllocated = uint64(res.Stats["allocated_bytes.all.peak"])
	res.PeakReserved = uint64(res.Stats["reserved_bytes.all.peak"])
	for id, p := range ptrs {
		if p != 0 {
			if err := a.Free(p); err != nil {
				return res, fmt.Errorf("allocbench: freeing storage %d at the end: %w", id, err)
			}
		}
	}
	return res, nil
}

// Iteration is what one pass of ReplayLoop did.
type Iteration struct {
	// Maps and Remaps are the granules mapped, and moved from cached memory,
	// during the pass (num_map and num_remap deltas).
	Maps, Remaps int64
	// DeviceAllocs is the num_device_alloc delta.
	DeviceAllocs int64
	// PeakAllocated and PeakReserved are the peaks so far.
	PeakAllocated, PeakReserved uint64
	// Elapsed is the time spent in Malloc and Free during the pass.
	Elapsed time.Duration
}

// ReplayLoop replays tr n times in a row through a, like n training
// iterations: each pass allocates its own storages and frees them all at the
// end of the pass, so the cache left by one pass serves the next.
func ReplayLoop(a *allocator.Allocator, tr *Trace, s device.Stream, n int) ([]Iteration, error) {
	var out []Iteration
	prev := a.Stats()
	for i := 0; i < n; i++ {
		res, err := Replay(a, tr, s)
		if err != nil {
			return out, fmt.Errorf("allocbench: pass %d: %w", i, err)
		}
		st := a.Stats()
		out = append(out, Iteration{
			Maps:          st["num_map"] - prev["num_map"],
			Remaps:        st["num_remap"] - prev["num_remap"],
			DeviceAllocs:  st["num_device_alloc"] - prev["num_device_alloc"],
			PeakAllocated: uint64(st["allocated_bytes.all.peak"]),
			PeakReserved:  uint64(st["reserved_bytes.all.peak"]),
			Elapsed:       res.Elapsed,
		})
		prev = st
	}
	return out, nil
}
