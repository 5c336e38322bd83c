package allocator

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/memscale/memscale/device"
)

// Config configures an Allocator.
type Config struct {
	// Device is the GPU (or its simulation) the memory comes from. Required.
	Device device.Device
	// Limit is the hard cap on reserved (physical) bytes; 0 means the device
	// capacity. It may not exceed the capacity.
	Limit uint64
	// EvictionThreshold is the memory budget, in bytes, that the eviction
	// engine keeps allocated bytes under; 0 means none. The allocator only
	// stores and reports it (stats key eviction_threshold_bytes).
	EvictionThreshold uint64
	// TraceCapacity is the number of alloc/free/map events kept for
	// Snapshot's device_traces (a ring; the oldest are dropped); 0 = off.
	TraceCapacity int
	// Logger receives debug and warning messages; nil means none.
	Logger *zap.Logger
	// DisableVMM makes the allocator use Device.Alloc segments even when the
	// device supports virtual memory management.
	DisableVMM bool
	// CacheSlack bounds the cache of an expandable-segment allocator. New
	// physical memory is created for a growing segment only while reserved
	// bytes stay within the high-water mark of allocated bytes plus
	// max(CacheSlack x that mark, 4 granules); beyond that, free granules
	// cached elsewhere whose streams have finished with them are unmapped and
	// mapped where they are needed. 0 therefore keeps reserved memory closest
	// to what was ever allocated at once; a negative value turns remapping off
	// below the Limit (PyTorch's behaviour: cached memory moves only when the
	// limit is reached or on EmptyCache). Ignored without VMM.
	CacheSlack float64
	// Budget is the DTR budget in bytes, when one is known at creation (0 =
	// none; SetBudget changes it). Without it, the eviction threshold stands
	// for the budget. See BudgetSlack.
	Budget uint64
	// BudgetSlack widens the cache bound of an expandable-segment allocator
	// under a DTR budget: while a budget is known, new physical memory is
	// created (instead of cached granules being remapped) up to the budget
	// plus BudgetSlack x the budget, never past Limit. A DTR engine holds
	// allocated bytes at the budget for the whole step, so with the bound of
	// CacheSlack alone nearly every cache miss remaps granules. 0 means
	// DefaultBudgetSlack; a negative value ignores the budget (the bound is
	// CacheSlack's alone). Ignored with a negative CacheSlack or without VMM.
	BudgetSlack float64
	// NoStepPlan turns step plans off: StepBoundary then does nothing
	// (as without VMM). With step plans on (the default), an
	// expandable-segment allocator that knows a DTR budget and is told where
	// steps begin (StepBoundary) places each step's large requests by a plan
	// computed from the step before, when the plan fits the budget's cache
	// bound or needs at most 1.2 times it (plan.go).
	NoStepPlan bool
}

// DefaultBudgetSlack is the BudgetSlack used when Config.BudgetSlack is 0:
// the cache may hold 10 % more than the DTR budget (bench/results/
// alloc-budget-remaps.md measures the trade-off between reserved memory and
// remapped granules).
const DefaultBudgetSlack = 0.10

// Reclaimer is called by Malloc, without the allocator's lock held, when a
// request cannot be met even after cached memory was released. need is the
// number of bytes missing. It frees memory (typically by evicting tensors
// and calling Free) and returns how many bytes it freed; 0 means it cannot
// help, and Malloc then fails with an *OOMError. Malloc calls from several
// goroutines may call it concurrently.
type Reclaimer func(need uint64) uint64

const (
	// quickCap is the number of freed blocks parked in the quick cache.
	quickCap = 32
	// maxMarks is the number of outstanding stream marks per stream.
	maxMarks = 4
	// maxReclaimRounds bounds the calls to the reclaimer per Malloc.
	maxReclaimRounds = 8
	// minCacheGranules is the cache allowance, in granules, below which
	// expandable segments never remap (see Config.CacheSlack).
	minCacheGranules = 4
)

// streamState tracks which of a stream's frees are known to be finished on
// the device: marks are events recorded on the stream, each covering every
// free made up to the allocator epoch it was recorded in.
type streamState struct {
	s        device.Stream
	done     uint64 // frees with freedAt <= done are finished
	lastFree uint64 // epoch of the latest free on s; marks are wanted while it is above done
	marks    []mark
}

type mark struct {
	covers uint64
	ev     device.Event
}

type segKey struct {
	pool   poolKind
	stream device.Stream
}

// Allocator is a caching allocator of device memory. It is safe for
// concurrent use. See the package documentation for its design.
type Allocator struct {
	mu sync.Mutex

	dev      device.Device
	info     device.Info
	log      *zap.Logger
	vmm      bool
	gran     uint64
	capacity uint64
	vaSize   uint64
	slack    float64
	// budgetSlack is Config.BudgetSlack resolved (negative: off).
	budgetSlack float64

	limit uint64
	// budget is the DTR budget set with SetBudget (0 = none: the eviction
	// threshold stands for it).
	budget  uint64
	closed  bool
	reclaim Reclaimer
	// threshold is the eviction threshold, read without the lock
	// (EvictionThreshold is on the C ABI's malloc path).
	threshold atomic.Uint64

	blocks       map[device.Ptr]*block // every mapped block by address
	pools        [numPools]pool
	quickStreams map[device.Stream]*quickStream
	lastQS       *quickStream
	quickLists   int
	quickHead    *block
	quickN       int
	pending      []*block

	segs       map[segKey][]*segment
	segList    []*segment // by base address
	streams    map[device.Stream]*streamState
	streamList []*streamState // in order of first use
	eventPool  []device.Event

	epoch uint64 // advanced each time marks are recorded
	hwm   uint64 // high-water mark of allocated bytes since the last EmptyCache
	phys  uint64 // physical bytes held (created and not released)
	virt  uint64 // address space reserved

	st  statTable
	cnt counters

	allocatedBytes atomic.Uint64
	// watermark is the highest allocatedBytes since ResetWatermark (a DTR
	// region's own peak, apart from the peak statistics the program resets).
	watermark     atomic.Uint64
	reservedBytes atomic.Uint64

	trace *traceRing

	// plans is the step-plan state (nil: off or without VMM).
	plans *stepPlans

	spare   []*block
	scratch []*block
	pivot   block // search key, reused
	handles []device.Handle
}

// New creates an allocator on cfg.Device.
func New(cfg Config) (*Allocator, error) {
	if cfg.Device == nil {
		return nil, fmt.Errorf("allocator: Config.Device is nil: %w", ErrInvalidArgument)
	}
	if cfg.TraceCapacity < 0 {
		return nil, fmt.Errorf("allocator: Config.TraceCapacity %d must be >= 0 (0 = off): %w", cfg.TraceCapacity, ErrInvalidArgument)
	}
	if math.IsNaN(cfg.CacheSlack) || math.IsInf(cfg.CacheSlack, 0) {
		return nil, fmt.Errorf("allocator: Config.CacheSlack %v must be a finite number: %w", cfg.CacheSlack, ErrInvalidArgument)
	}
	if math.IsNaN(cfg.BudgetSlack) || math.IsInf(cfg.BudgetSlack, 0) {
		return nil, fmt.Errorf("allocator: Config.BudgetSlack %v must be a finite number: %w", cfg.BudgetSlack, ErrInvalidArgument)
	}
	info := cfg.Device.Info()
	capacity := info.TotalMemory
	if capacity == 0 {
		_, total, err := cfg.Device.MemInfo()
		if err != nil {
			return nil, fmt.Errorf("allocator: reading the device capacity: %w", err)
		}
		capacity = total
	}
	if capacity == 0 {
		return nil, fmt.Errorf("allocator: device %q reports no memory: %w", info.Name, ErrInvalidSize)
	}
	if cfg.Limit > capacity {
		return nil, fmt.Errorf("allocator: Config.Limit %d exceeds the device capacity %d: %w", cfg.Limit, capacity, ErrInvalidSize)
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	a := &Allocator{
		dev:          cfg.Device,
		info:         info,
		log:          log,
		capacity:     capacity,
		limit:        cfg.Limit,
		slack:        cfg.CacheSlack,
		budgetSlack:  cfg.BudgetSlack,
		budget:       cfg.Budget,
		blocks:       make(map[device.Ptr]*block),
		quickStreams: make(map[device.Stream]*quickStream),
		segs:         make(map[segKey][]*segment),
		streams:      make(map[device.Stream]*streamState),
		epoch:        1,
	}
	if a.limit == 0 {
		a.limit = capacity
	}
	if a.budgetSlack == 0 {
		a.budgetSlack = DefaultBudgetSlack
	}
	a.threshold.Store(cfg.EvictionThreshold)
	g := info.Granularity
	if info.VMM && !cfg.DisableVMM {
		if g == 0 || g%MinBlockSize != 0 {
			return nil, fmt.Errorf("allocator: device granularity %d is not a positive multiple of %d: %w", g, MinBlockSize, ErrInvalidSize)
		}
		a.vmm = true
		a.gran = g
		// Twice the capacity: room for the live blocks of a segment to drift
		// through its range as granules move; a segment that still runs out
		// gets a sibling.
		a.vaSize = alignUp(2*capacity, g)
		if !cfg.NoStepPlan {
			a.plans = newStepPlans()
		}
	}
	for p := range a.pools {
		a.pools[p] = newPool()
	}
	if cfg.TraceCapacity > 0 {
		a.trace = newTraceRing(cfg.TraceCapacity)
	}
	log.Debug("allocator created",
		zap.String("backend", info.Backend), zap.String("device", info.Name),
		zap.Uint64("capacity", capacity), zap.Uint64("limit", a.limit),
		zap.Bool("expandable_segments", a.vmm), zap.Uint64("granularity", g))
	return a, nil
}

// Malloc returns a block of at least size bytes, aligned to 512 bytes, for use
// on stream s. Size 0 is valid and returns a distinct 512-byte block (the
// pointer is never 0) whose requested size is 0. Sizes above MaxSize fail with
// ErrInvalidSize; a request that cannot be met fails with an *OOMError.
func (a *Allocator) Malloc(size uint64, s device.Stream) (device.Ptr, error) {
	if size > MaxSize {
		return 0, fmt.Errorf("allocator: Malloc(%d): size exceeds the maximum %d: %w", size, uint64(MaxSize), ErrInvalidSize)
	}
	r := roundSize(size)
	a.mu.Lock()
	defer a.mu.Unlock() // also on an internal-error panic, which cabi recovers
	if a.closed {
		return 0, fmt.Errorf("allocator: Malloc(%d): %w", size, ErrClosed)
	}
	if len(a.pending) > 0 {
		a.processPending()
	}
	if a.plans != nil && (a.plans.active || a.plans.pick) && r > SmallSize {
		if b := a.planPlace(r, s); b != nil {
			a.markAllocated(b, size)
			a.reservedBytes.Store(uint64(a.st.cur(stReservedBytes)))
			return b.addr, nil
		}
	}
	if a.quickN > 0 {
		if l := a.quickLookup(s, r); l != nil && l.head != nil {
			b := a.quickPop(l)
			a.cnt.quickHits++
			a.markAllocated(b, size)
			return b.addr, nil
		}
	}
	p, err := a.mallocSlow(size, r, s)
	a.reservedBytes.Store(uint64(a.st.cur(stReservedBytes)))
	return p, err
}

// Free returns p, from Malloc, to the cache. A pointer that is not the start
// of a live allocation fails with ErrUnknownPointer, or ErrDoubleFree when it
// lies in memory that is already free; nothing changes then. If RecordStream
// gave p other streams, the memory is reused only after the work queued on
// them so far has finished.
func (a *Allocator) Free(p device.Ptr) error {
	_, err := a.FreeRequested(p)
	return err
}

// FreeRequested is Free that also returns the size Malloc was asked for, in
// the same critical section: what the C ABI needs to check the size PyTorch
// passes to free without a second lookup.
func (a *Allocator) FreeRequested(p device.Ptr) (requested uint64, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.blocks[p]
	if b == nil || b.state != stateAllocated {
		return 0, a.badPointer("Free", p, b)
	}
	requested = b.req // before cacheFreed, which may merge b away
	if b.rec != 0 {
		a.recordFree(b)
	}
	if b.streams != nil {
		return requested, a.freeWithEvents(b)
	}
	pk := b.seg.pool
	size := int64(b.size)
	a.st.add(stAllocation, pk, -1)
	a.st.add(stAllocatedBytes, pk, -size)
	a.st.add(stActive, pk, -1)
	a.st.add(stActiveBytes, pk, -size)
	a.st.add(stRequestedBytes, pk, -int64(b.req))
	a.allocatedBytes.Store(uint64(a.st[stAllocatedBytes][0].cur))
	if a.trace != nil {
		a.trace.add(actFreeRequested, b.addr, b.size, b.stream)
		a.trace.add(actFreeCompleted, b.addr, b.size, b.stream)
	}
	a.cacheFreed(b)
	return requested, nil
}

// RecordStream tells the allocator that the allocation at p is also used by
// work queued on stream s, so that after Free it is not reused before that
// work finished (torch's Tensor.record_stream). Recording the allocation's own
// stream, or a stream twice, does nothing.
func (a *Allocator) RecordStream(p device.Ptr, s device.Stream) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("allocator: RecordStream(%#x): %w", uintptr(p), ErrClosed)
	}
	b := a.blocks[p]
	if b == nil || b.state != stateAllocated {
		return fmt.Errorf("allocator: RecordStream(%#x, stream %#x): not a live allocation: %w", uintptr(p), uintptr(s), ErrUnknownPointer)
	}
	if s == b.stream {
		return nil
	}
	for _, x := range b.streams {
		if x == s {
			return nil
		}
	}
	// A stream this device cannot record events on (another device's) is
	// refused now, with the allocation untouched, rather than failing at Free.
	if err := a.dev.CheckStream(s); err != nil {
		return fmt.Errorf("allocator: RecordStream(%#x, stream %#x): the allocation is unchanged: %w", uintptr(p), uintptr(s), err)
	}
	b.streams = append(b.streams, s)
	return nil
}

// EmptyCache waits for the device to finish its queued work (one device
// synchronization, no call on any stream), then returns every cached byte to
// the device: the free granules of expandable segments are unmapped and
// released, whole free segments are freed. Live allocations are untouched.
// If the device cannot be waited for, it says so and releases only the
// memory already known to be idle.
func (a *Allocator) EmptyCache() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("allocator: EmptyCache: %w", ErrClosed)
	}
	err := a.syncAll()
	a.flushQuick()
	rerr := a.releaseCached(math.MaxUint64)
	a.hwm = uint64(a.st.cur(stAllocatedBytes))
	a.publish()
	if err = errors.Join(err, rerr); err != nil {
		return fmt.Errorf("allocator: EmptyCache: %w", err)
	}
	return nil
}

// SetLimit sets the hard limit on reserved bytes; 0 means the device
// capacity. Frees waiting on recorded streams that have completed are
// finished first; then cached memory above a lower limit is released at once
// (as far as its streams have finished with it). Memory in use stays, and
// growth is refused until usage is back under the limit.
func (a *Allocator) SetLimit(bytes uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("allocator: SetLimit(%d): %w", bytes, ErrClosed)
	}
	if bytes > a.capacity {
		return fmt.Errorf("allocator: SetLimit(%d): exceeds the device capacity %d: %w", bytes, a.capacity, ErrInvalidSize)
	}
	if bytes == 0 {
		bytes = a.capacity
	}
	a.limit = bytes
	if len(a.pending) > 0 {
		a.processPending()
	}
	if a.phys > a.limit {
		a.flushQuick()
		a.refreshMarks(nil)
		if err := a.releaseCached(a.phys - a.limit); err != nil {
			a.log.Warn("allocator: releasing cached memory for a lower limit", zap.Error(err))
		}
		a.publish()
	}
	return nil
}

// SetMemoryFraction sets the limit to f times the device capacity, f in
// (0, 1] (torch.cuda.set_per_process_memory_fraction).
func (a *Allocator) SetMemoryFraction(f float64) error {
	if math.IsNaN(f) || f <= 0 || f > 1 {
		return fmt.Errorf("allocator: SetMemoryFraction(%v): fraction must be in (0, 1]: %w", f, ErrInvalidArgument)
	}
	limit := uint64(f * float64(a.capacity))
	if limit == 0 {
		limit = 1
	}
	if limit > a.capacity {
		limit = a.capacity
	}
	return a.SetLimit(limit)
}

// Limit returns the hard limit on reserved bytes in force.
func (a *Allocator) Limit() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.limit
}

// SetEvictionThreshold stores the eviction threshold (0 = none).
func (a *Allocator) SetEvictionThreshold(bytes uint64) { a.threshold.Store(bytes) }

// EvictionThreshold returns the eviction threshold (0 = none) with one
// atomic load.
func (a *Allocator) EvictionThreshold() uint64 { return a.threshold.Load() }

// SetBudget tells the allocator the DTR budget in bytes that an eviction
// engine holds allocated memory under (0 = none: the eviction threshold, if
// any, stands for it). While a budget is known the cache may hold up to the
// budget plus Config.BudgetSlack of it (never more than the limit) before
// it remaps cached granules: see Config.BudgetSlack. Memory already reserved
// stays; a lower bound takes effect as the cache is reused.
func (a *Allocator) SetBudget(bytes uint64) {
	a.mu.Lock()
	a.budget = bytes
	a.mu.Unlock()
}

// SetBudgetSlack sets Config.BudgetSlack: 0 = DefaultBudgetSlack, negative
// = the budget does not widen the cache bound. A NaN or infinite value fails
// with ErrInvalidArgument.
func (a *Allocator) SetBudgetSlack(f float64) error {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("allocator: SetBudgetSlack(%v): must be a finite number: %w", f, ErrInvalidArgument)
	}
	if f == 0 {
		f = DefaultBudgetSlack
	}
	a.mu.Lock()
	a.budgetSlack = f
	a.mu.Unlock()
	return nil
}

// Budget returns the DTR budget the cache bound follows: the one set with
// SetBudget, else the eviction threshold (0 = none).
func (a *Allocator) Budget() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.budgetInForce()
}

// budgetInForce is Budget with a.mu held.
func (a *Allocator) budgetInForce() uint64 {
	if a.budget > 0 {
		return a.budget
	}
	return a.threshold.Load()
}

// SetReclaimer installs the function Malloc calls before failing for lack
// of memory (nil removes it).
func (a *Allocator) SetReclaimer(fn Reclaimer) {
	a.mu.Lock()
	a.reclaim = fn
	a.mu.Unlock()
}

// Allocated returns the bytes in live allocations (allocated_bytes.all.current)
// with one atomic load.
func (a *Allocator) Allocated() uint64 { return a.allocatedBytes.Load() }

// Watermark returns the highest allocated bytes since the last
// ResetWatermark (or since New), sampled at every allocation, so it sees an
// op's temporaries. It is apart from allocated_bytes.all.peak, which the
// program resets with ResetPeakStats.
func (a *Allocator) Watermark() uint64 { return a.watermark.Load() }

// ResetWatermark starts a new watermark at the bytes allocated now.
func (a *Allocator) ResetWatermark() {
	a.mu.Lock()
	a.watermark.Store(a.allocatedBytes.Load())
	a.mu.Unlock()
}

// Reserved returns the bytes mapped in segments (reserved_bytes.all.current)
// with one atomic load.
func (a *Allocator) Reserved() uint64 { return a.reservedBytes.Load() }

// ExpandableSegments reports whether segments are backed by VMM.
func (a *Allocator) ExpandableSegments() bool { return a.vmm }

// Stats returns every counter under torch.cuda.memory_stats() names (see
// Stats) plus memscale's keys:
//
//	limit_bytes, eviction_threshold_bytes, device_total_bytes,
//	granularity_bytes (0 without VMM), expandable_segments (0/1),
//	physical_bytes (memory held, mapped or not), mapped_bytes,
//	virtual_bytes (address space reserved), num_map / num_unmap (granules),
//	num_remap (granules moved from cached memory to where they were needed),
//	num_map_calls / num_unmap_calls (driver calls: MapRange, Unmap),
//	budget_bytes (the DTR budget the cache bound follows, 0 = none),
//	budget_slack_ppm (BudgetSlack in millionths; negative: budget ignored),
//	cache_bound_bytes (reserved bytes up to which growth creates memory
//	rather than remapping cached granules; -1 = no bound below the limit),
//	num_quick_hits (allocations served from the quick cache),
//	num_stream_marks (events recorded to learn when streams finish),
//	pending_frees (frees waiting on RecordStream streams),
//	quick_cached_blocks, high_water_bytes (allocated high-water mark since
//	the last EmptyCache); with step plans (plan.go): num_steps
//	(StepBoundary calls), num_step_plans (plans computed),
//	num_step_plans_reused (boundaries that filed the step under a plan of
//	the library: its kind's requests), step_plan_active (0/1: a plan in
//	force or to be chosen), step_plans_stored (plans in the library, one
//	per kind of step), num_step_plan_switches (plans replaced within a
//	step), step_plan_span_bytes and step_plan_need_bytes (the last plan's
//	span, and with the step's other memory, what it needs),
//	num_step_plan_placed / num_step_plan_missed (large requests placed by
//	the plan / that fell back to best fit).
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := make(Stats, 160)
	a.st.fill(m)
	m["num_alloc_retries"] = a.cnt.allocRetries
	m["num_ooms"] = a.cnt.ooms
	m["num_sync_all_streams"] = a.cnt.syncAllStreams
	m["num_device_alloc"] = a.cnt.deviceAllocs
	m["num_device_free"] = a.cnt.deviceFrees
	m["max_split_size"] = -1
	m["limit_bytes"] = int64(a.limit)
	m["eviction_threshold_bytes"] = int64(a.threshold.Load())
	m["device_total_bytes"] = int64(a.capacity)
	m["granularity_bytes"] = int64(a.gran)
	m["expandable_segments"] = b2i(a.vmm)
	m["physical_bytes"] = int64(a.phys)
	m["mapped_bytes"] = a.st.cur(stReservedBytes)
	m["virtual_bytes"] = int64(a.virt)
	m["num_map"] = a.cnt.maps
	m["num_unmap"] = a.cnt.unmaps
	m["num_remap"] = a.cnt.remaps
	m["num_map_calls"] = a.cnt.mapCalls
	m["num_unmap_calls"] = a.cnt.unmapCalls
	m["budget_bytes"] = int64(a.budgetInForce())
	m["budget_slack_ppm"] = int64(a.budgetSlack * 1e6)
	m["cache_bound_bytes"] = int64(a.cacheBound(0))
	m["num_quick_hits"] = a.cnt.quickHits
	m["num_stream_marks"] = a.cnt.marks
	m["pending_frees"] = int64(len(a.pending))
	m["quick_cached_blocks"] = int64(a.quickN)
	m["high_water_bytes"] = int64(a.hwm)
	if p := a.plans; p != nil {
		m["num_steps"] = p.steps
		m["num_step_plans"] = p.built
		m["num_step_plans_reused"] = p.reused
		m["step_plan_active"] = b2i(p.active || p.pick)
		m["step_plans_stored"] = int64(len(p.lib))
		m["num_step_plan_switches"] = p.switches
		m["step_plan_span_bytes"] = int64(p.lastSpan)
		m["step_plan_need_bytes"] = int64(p.lastNeed)
		m["num_step_plan_placed"] = p.placedN
		m["num_step_plan_missed"] = p.missedN
	}
	return m
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// ResetPeakStats sets every peak to the current value.
func (a *Allocator) ResetPeakStats() {
	a.mu.Lock()
	a.st.resetPeaks()
	a.mu.Unlock()
}

// SizeOf returns the requested size of the live allocation at p.
func (a *Allocator) SizeOf(p device.Ptr) (uint64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.blocks[p]
	if b == nil || b.state != stateAllocated {
		return 0, false
	}
	return b.req, true
}

// FreeNeighbors returns the cached free bytes directly before and after the
// live allocation at p in its segment (the runs of free blocks up to the next
// block in use): what freeing p would coalesce with (MegEngine's
// free-neighbour measure for eviction). Unmapped address space does not
// count. Both are 0 for a pointer that is not a live allocation.
func (a *Allocator) FreeNeighbors(p device.Ptr) (left, right uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.blocks[p]
	if b == nil || b.state != stateAllocated {
		return 0, 0
	}
	for q := b.prev; q != nil && q.state == stateFree; q = q.prev {
		left += q.size
	}
	for q := b.next; q != nil && q.state == stateFree; q = q.next {
		right += q.size
	}
	return left, right
}

// Close returns all memory to the device and destroys the allocator's
// events. Allocations still live lose their memory too; Close reports them.
// Every later call fails with ErrClosed (Close itself returns nil).
func (a *Allocator) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	var live, liveBytes uint64
	for _, b := range a.blocks {
		if b.state == stateAllocated || b.state == statePending {
			live++
			liveBytes += b.size
		}
	}
	var errs []error
	for _, b := range a.pending {
		for _, e := range b.events {
			a.eventPool = append(a.eventPool, e)
		}
		b.events = nil
	}
	for _, st := range a.streamList {
		for _, m := range st.marks {
			a.eventPool = append(a.eventPool, m.ev)
		}
		st.marks = nil
	}
	for _, seg := range a.segList {
		if err := a.destroySegment(seg); err != nil {
			errs = append(errs, err)
		}
	}
	for _, e := range a.eventPool {
		if err := a.dev.DestroyEvent(e); err != nil {
			errs = append(errs, fmt.Errorf("destroying event %d: %w", e, err))
		}
	}
	a.eventPool = nil
	a.segList = nil
	clear(a.segs)
	clear(a.blocks)
	clear(a.quickStreams)
	a.lastQS = nil
	a.quickHead, a.quickN, a.pending = nil, 0, nil
	for p := range a.pools {
		a.pools[p] = newPool()
	}
	if a.plans != nil {
		a.plans = newStepPlans()
	}
	a.allocatedBytes.Store(0)
	a.reservedBytes.Store(0)
	if live > 0 {
		errs = append(errs, fmt.Errorf("%d allocations (%d bytes) were still live; their memory was released", live, liveBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("allocator: Close: %w", err)
	}
	return nil
}

// publish stores the atomically readable totals.
func (a *Allocator) publish() {
	a.allocatedBytes.Store(uint64(a.st.cur(stAllocatedBytes)))
	a.reservedBytes.Store(uint64(a.st.cur(stReservedBytes)))
}

// markAllocated hands out the free block b (taken out of the cache) for a
// request of size bytes.
func (a *Allocator) markAllocated(b *block, size uint64) {
	pk := b.seg.pool
	n := int64(b.size)
	if b.quick || b.state != stateFree {
		panic("allocator: internal error: allocating a block that is not a detached free block")
	}
	b.state = stateAllocated
	b.req = size
	a.st.add(stAllocation, pk, 1)
	a.st.add(stAllocatedBytes, pk, n)
	a.st.add(stActive, pk, 1)
	a.st.add(stActiveBytes, pk, n)
	a.st.add(stRequestedBytes, pk, int64(size))
	cur := uint64(a.st[stAllocatedBytes][0].cur)
	if cur > a.hwm {
		a.hwm = cur
	}
	if p := a.plans; p != nil && p.step > 0 {
		if pk == largePool {
			a.recordAlloc(b)
		}
		p.otherPeak = max(p.otherPeak, cur-min(cur, p.liveRec))
	}
	a.allocatedBytes.Store(cur)
	if cur > a.watermark.Load() {
		a.watermark.Store(cur) // under a.mu: no lost update
	}
	if a.trace != nil {
		a.trace.add(actAlloc, b.addr, b.size, b.stream)
	}
}

// badPointer builds the error for a pointer that is not a live allocation.
func (a *Allocator) badPointer(op string, p device.Ptr, b *block) error {
	if a.closed {
		return fmt.Errorf("allocator: %s(%#x): %w", op, uintptr(p), ErrClosed)
	}
	if b != nil {
		switch b.state {
		case statePending:
			return fmt.Errorf("allocator: %s(%#x): already freed (waiting for recorded streams): %w", op, uintptr(p), ErrDoubleFree)
		case stateFree:
			return fmt.Errorf("allocator: %s(%#x): already freed (cached): %w", op, uintptr(p), ErrDoubleFree)
		}
	}
	seg := a.segmentOf(p)
	if seg == nil {
		return fmt.Errorf("allocator: %s(%#x): %w", op, uintptr(p), ErrUnknownPointer)
	}
	for c := seg.head; c != nil; c = c.next {
		if p >= c.addr && p < c.end() {
			switch {
			case c.state == stateAllocated:
				return fmt.Errorf("allocator: %s(%#x): points %d bytes into the allocation at %#x, not at its start: %w",
					op, uintptr(p), p-c.addr, uintptr(c.addr), ErrUnknownPointer)
			case p%MinBlockSize != 0:
				return fmt.Errorf("allocator: %s(%#x): not aligned to %d bytes: %w", op, uintptr(p), MinBlockSize, ErrUnknownPointer)
			default:
				return fmt.Errorf("allocator: %s(%#x): the memory there is already free (%s): %w",
					op, uintptr(p), c.stateName(), ErrDoubleFree)
			}
		}
	}
	return fmt.Errorf("allocator: %s(%#x): %w", op, uintptr(p), ErrUnknownPointer)
}

func (b *block) stateName() string {
	switch b.state {
	case stateFree:
		return "cached"
	case stateAllocated:
		return "allocated"
	case statePending:
		return "pending free"
	default:
		return "unmapped"
	}
}

// segmentOf returns the segment containing p, or nil.
func (a *Allocator) segmentOf(p device.Ptr) *segment {
	i := sort.Search(len(a.segList), func(i int) bool { return a.segList[i].base > p }) - 1
	if i < 0 || p >= a.segList[i].end() {
		return nil
	}
	return a.segList[i]
}

// addSegment registers a new segment.
func (a *Allocator) addSegment(seg *segment) {
	k := segKey{seg.pool, seg.stream}
	a.segs[k] = append(a.segs[k], seg)
	i := sort.Search(len(a.segList), func(i int) bool { return a.segList[i].base > seg.base })
	a.segList = append(a.segList, nil)
	copy(a.segList[i+1:], a.segList[i:])
	a.segList[i] = seg
	a.st.add(stSegment, seg.pool, 1)
}

// removeSegment forgets a segment whose memory has been returned.
func (a *Allocator) removeSegment(seg *segment) {
	if a.plans != nil && a.plans.segs[seg.stream] == seg {
		a.plans.dropSegment(seg.stream)
	}
	k := segKey{seg.pool, seg.stream}
	list := a.segs[k]
	for i, s := range list {
		if s == seg {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(a.segs, k)
		a.forgetStream(seg.stream)
	} else {
		a.segs[k] = list
	}
	i := sort.Search(len(a.segList), func(i int) bool { return a.segList[i].base >= seg.base })
	if i < len(a.segList) && a.segList[i] == seg {
		a.segList = append(a.segList[:i], a.segList[i+1:]...)
	}
	a.st.add(stSegment, seg.pool, -1)
}

// streamState returns the state of stream s, creating it on first use.
func (a *Allocator) streamState(s device.Stream) *streamState {
	st := a.streams[s]
	if st == nil {
		st = &streamState{s: s}
		a.streams[s] = st
		a.streamList = append(a.streamList, st)
	}
	return st
}

// forgetStream drops the state of stream s once no segment of either pool
// belongs to it, so that no mark is ever recorded on a stream the
// allocator holds no memory of (it may have been destroyed).
func (a *Allocator) forgetStream(s device.Stream) {
	for pk := range a.pools {
		if len(a.segs[segKey{poolKind(pk), s}]) > 0 {
			return
		}
	}
	st := a.streams[s]
	if st == nil {
		return
	}
	for _, m := range st.marks {
		a.putEvent(m.ev)
	}
	delete(a.streams, s)
	for i, x := range a.streamList {
		if x == st {
			a.streamList = append(a.streamList[:i], a.streamList[i+1:]...)
			break
		}
	}
}

// getEvent returns an event from the pool or a new one.
func (a *Allocator) getEvent() (device.Event, error) {
	if n := len(a.eventPool); n > 0 {
		e := a.eventPool[n-1]
		a.eventPool = a.eventPool[:n-1]
		return e, nil
	}
	e, err := a.dev.CreateEvent()
	if err != nil {
		return 0, fmt.Errorf("creating an event: %w", err)
	}
	return e, nil
}

func (a *Allocator) putEvent(e device.Event) { a.eventPool = append(a.eventPool, e) }

// newBlock returns a zeroed block, reusing a spare one.
func (a *Allocator) newBlock() *block {
	if n := len(a.spare); n > 0 {
		b := a.spare[n-1]
		a.spare = a.spare[:n-1]
		return b
	}
	return new(block)
}

// dropBlock recycles a block that left its segment.
func (a *Allocator) dropBlock(b *block) {
	*b = block{}
	if len(a.spare) < 1024 {
		a.spare = append(a.spare, b)
	}
}

func alignUp(n, g uint64) uint64   { return (n + g - 1) / g * g }
func alignDown(n, g uint64) uint64 { return n / g * g }
