// Package micro is the allocation latency grid of `memscale bench micro`:
// request sizes from 512 B to 1 GiB, 1/4/16 threads, 1/4 streams, cached
// and uncached, as malloc+free pairs and as random interleavings in the
// manner of RMM's random_allocations benchmark, through memscale's
// allocator on the simulated device or a GPU.
//
// Allocator time is measured around Malloc and Free called from Go. The C
// ABI that PyTorch goes through (libmemscale.so's memscale_malloc/free)
// adds one C-to-Go crossing per call; its cost is measured separately
// (CrossingCost) and reported in its own column, never folded in.
package micro

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/memscale/memscale/allocator"
	"github.com/memscale/memscale/device"
)

// Pattern is how a cell allocates.
type Pattern string

// The patterns.
const (
	// Pairs is malloc immediately followed by free of the same block.
	Pairs Pattern = "pairs"
	// Random interleaves allocations of uniformly random sizes up to the
	// cell's size with frees of random live blocks (RMM's
	// random_allocations: allocate with probability 1/2 while below the
	// live cap, otherwise free).
	Random Pattern = "random"
)

// Cell is one point of the grid.
type Cell struct {
	Size    uint64  `json:"size"`
	Threads int     `json:"threads"`
	Streams int     `json:"streams"`
	Cached  bool    `json:"cached"`
	Pattern Pattern `json:"pattern"`
}

// Result is one cell's measurement.
type Result struct {
	Cell
	// Ops is the number of Malloc and Free calls timed.
	Ops int `json:"ops"`
	// P50, P99 and Max are per-call latencies (Malloc and Free together).
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
	// MallocP50 is the median Malloc alone.
	MallocP50 time.Duration `json:"malloc_p50_ns"`
	// OpsPerSec is calls per second of wall time, all threads together,
	// from the moment every thread finished warming up to the last one's
	// end (uncached cells: the untimed EmptyCache calls included).
	OpsPerSec float64 `json:"ops_per_sec"`
	// Error is set when the cell could not run.
	Error string `json:"error,omitempty"`
}

// Options configure a grid run.
type Options struct {
	// Sizes, Threads, Streams list the grid's axes; empty = the defaults.
	Sizes   []uint64
	Threads []int
	Streams []int
	// Patterns and Cached select the rest; empty = both of each.
	Patterns []Pattern
	Cached   []bool
	// Iterations is the malloc+free pairs (or random steps) per thread per
	// cell (0 = 2000); uncached cells and cells of 64 MiB and more use a
	// tenth of it (at least 10).
	Iterations int
	// MaxLive caps a random cell's live bytes per thread (0 = 1 GiB).
	MaxLive uint64
	// NewDevice opens a fresh device for each cell.
	NewDevice func() (device.Device, error)
	// Config is the allocator configuration (Device is set per cell).
	Config allocator.Config
	// Progress is called after each cell.
	Progress func(done, total int, c Cell)
}

// DefaultSizes spans 512 B to 1 GiB in factors of 8 (plus 1 GiB).
var DefaultSizes = []uint64{512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 128 << 20, 1 << 30}

// Grid expands the options into cells.
func (o *Options) Grid() []Cell {
	sizes := o.Sizes
	if len(sizes) == 0 {
		sizes = DefaultSizes
	}
	threads := o.Threads
	if len(threads) == 0 {
		threads = []int{1, 4, 16}
	}
	streams := o.Streams
	if len(streams) == 0 {
		streams = []int{1, 4}
	}
	patterns := o.Patterns
	if len(patterns) == 0 {
		patterns = []Pattern{Pairs, Random}
	}
	cached := o.Cached
	if len(cached) == 0 {
		cached = []bool{true, false}
	}
	var out []Cell
	for _, p := range patterns {
		for _, c := range cached {
			for _, s := range sizes {
				for _, t := range threads {
					for _, st := range streams {
						out = append(out, Cell{Size: s, Threads: t, Streams: st, Cached: c, Pattern: p})
					}
				}
			}
		}
	}
	return out
}

// Run measures every cell of the grid.
func Run(ctx context.Context, o Options) ([]Result, error) {
	cells := o.Grid()
	out := make([]Result, 0, len(cells))
	for i, c := range cells {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		r := RunCell(o, c)
		out = append(out, r)
		if o.Progress != nil {
			o.Progress(i+1, len(cells), c)
		}
	}
	return out, nil
}

// RunCell measures one cell on a fresh device and allocator.
func RunCell(o Options, c Cell) Result {
	res := Result{Cell: c}
	dev, err := o.NewDevice()
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer dev.Close()
	cfg := o.Config
	cfg.Device = dev
	a, err := allocator.New(cfg)
	if err != nil {
		res.Error = fmt.Sprintf("allocator: %v", err)
		return res
	}
	defer a.Close()
	iters := o.Iterations
	if iters <= 0 {
		iters = 2000
	}
	if !c.Cached || c.Size >= 64<<20 {
		iters = max(10, iters/10)
	}
	maxLive := o.MaxLive
	if maxLive == 0 {
		maxLive = 1 << 30
	}
	type sample struct {
		d      time.Duration
		malloc bool
	}
	per := make([][]sample, c.Threads)
	errs := make([]error, c.Threads)
	var mu sync.Mutex // serializes EmptyCache with the uncached cells' mallocs
	var wg, warm sync.WaitGroup
	starts, ends := make([]time.Time, c.Threads), make([]time.Time, c.Threads)
	warm.Add(c.Threads)
	for t := 0; t < c.Threads; t++ {
		wg.Add(1)
		go func(t int) {
			defer wg.Done()
			s := device.Stream(t % c.Streams)
			rng := rand.New(rand.NewPCG(uint64(t), 42))
			samples := make([]sample, 0, 2*iters)
			timed := func(malloc bool, f func() error) error {
				t0 := time.Now()
				err := f()
				samples = append(samples, sample{time.Since(t0), malloc})
				return err
			}
			var live []device.Ptr
			var liveBytes uint64
			sizes := map[device.Ptr]uint64{}
			free := func(i int) error {
				p := live[i]
				live[i] = live[len(live)-1]
				live = live[:len(live)-1]
				liveBytes -= sizes[p]
				delete(sizes, p)
				return timed(false, func() error { return a.Free(p) })
			}
			if c.Cached {
				// Warm: one block of the cell's size per thread, freed.
				if p, err := a.Malloc(c.Size, s); err == nil {
					_ = a.Free(p)
				}
			}
			warm.Done()
			warm.Wait()
			starts[t] = time.Now()
			defer func() { ends[t] = time.Now() }()
			for i := 0; i < iters && errs[t] == nil; i++ {
				if !c.Cached {
					mu.Lock()
					errs[t] = a.EmptyCache()
					mu.Unlock()
				}
				size := c.Size
				if c.Pattern == Random {
					size = 1 + rng.Uint64N(c.Size)
				}
				if c.Pattern == Pairs {
					var p device.Ptr
					if errs[t] = timed(true, func() (err error) { p, err = a.Malloc(size, s); return err }); errs[t] != nil {
						break
					}
					errs[t] = timed(false, func() error { return a.Free(p) })
					continue
				}
				if len(live) > 0 && (rng.IntN(2) == 0 || liveBytes+size > maxLive) {
					errs[t] = free(rng.IntN(len(live)))
					continue
				}
				var p device.Ptr
				if errs[t] = timed(true, func() (err error) { p, err = a.Malloc(size, s); return err }); errs[t] == nil {
					live = append(live, p)
					sizes[p] = size
					liveBytes += size
				}
			}
			for len(live) > 0 && errs[t] == nil {
				errs[t] = free(len(live) - 1)
			}
			per[t] = samples
		}(t)
	}
	wg.Wait()
	var all, mallocs []time.Duration
	for t := range per {
		if errs[t] != nil && res.Error == "" {
			res.Error = errs[t].Error()
		}
		for _, s := range per[t] {
			all = append(all, s.d)
			if s.malloc {
				mallocs = append(mallocs, s.d)
			}
		}
	}
	res.Ops = len(all)
	if len(all) == 0 {
		return res
	}
	slices.Sort(all)
	slices.Sort(mallocs)
	res.P50, res.P99, res.Max = all[len(all)/2], all[min(len(all)-1, len(all)*99/100)], all[len(all)-1]
	if len(mallocs) > 0 {
		res.MallocP50 = mallocs[len(mallocs)/2]
	}
	var first, last time.Time
	for t := range starts {
		if first.IsZero() || starts[t].Before(first) {
			first = starts[t]
		}
		if ends[t].After(last) {
			last = ends[t]
		}
	}
	wall := last.Sub(first)
	if wall > 0 {
		res.OpsPerSec = float64(res.Ops) / wall.Seconds()
	}
	return res
}
