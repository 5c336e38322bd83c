// The Engine: its types, construction, accessors and counters.
// See doc.go for the design.

package evict

import (
	"errors"
	"fmt"

	"github.com/memscale/memscale/internal/satmath"
	rc "github.com/memscale/memscale/recompute"
)

// Action is what the engine did with a victim.
type Action uint8

// Victim actions (the values are the C ABI's).
const (
	// Drop: the storage was evicted; it is rebuilt by recomputation.
	Drop Action = 0
	// Swap: the storage is to be copied to host memory.
	Swap Action = 1
)

// String names the action.
func (a Action) String() string {
	if a == Swap {
		return "swap"
	}
	return "drop"
}

// Victim is a storage the engine took out of device memory. The engine has
// already marked it; the caller frees the memory (and, for Swap, copies it
// to host first). Every view of the storage goes with it.
type Victim struct {
	// Tensor is the storage's root tensor.
	Tensor rc.TensorID
	// Action says whether to drop or swap.
	Action Action
	// Size is the storage's size in bytes.
	Size uint64
}

// ErrNoEvictable is returned (wrapped, with usage and budget) when usage is
// over the budget and nothing can be evicted.
var ErrNoEvictable = errors.New("nothing evictable")

// TooLargeError is what Evict returns, before evicting anything, when the
// allocation it is to make room for is larger than the whole budget: no
// eviction could make room for it. It matches ErrNoEvictable (errors.Is).
type TooLargeError struct {
	// Extra is the size of the allocation, Budget the budget and Pinned
	// the bytes of the pinned resident storages, all in bytes.
	Extra, Budget, Pinned uint64
	// PinnedAtRegistration and PinnedLater split Pinned by when the
	// storages were pinned (NewTensor, Pin); UnderMinSize is the bytes of
	// the resident unpinned storages under the minimum evictee size;
	// Locked is the bytes of the locked resident storages that are neither.
	PinnedAtRegistration, PinnedLater, UnderMinSize, Locked uint64
	// MinBudget is the step's minimum budget so far (Engine.MinBudget).
	MinBudget MinBudgetParts
	// Plans is the number of unfinished rematerialization plans holding
	// inputs among Locked; Finished that the engine was finished (the
	// request was for what leaves the step).
	Plans    int
	Finished bool
}

// Error says that the budget is below what the step needs at this point
// (naming the parts), what is too large, and what budget would do.
func (e *TooLargeError) Error() string {
	f := floorNow{reg: e.PinnedAtRegistration, later: e.PinnedLater, small: e.UnderMinSize, locked: e.Locked, extra: e.Extra,
		most: e.MinBudget, plans: e.Plans, finished: e.Finished}
	return fmt.Sprintf("evict: %san allocation of %d bytes is larger than the whole budget of %d bytes: "+
		"raise the budget above %d plus the pinned bytes (%d now)", f.below(e.Budget), e.Extra, e.Budget, e.Extra, e.Pinned)
}

// Unwrap returns ErrNoEvictable.
func (e *TooLargeError) Unwrap() error { return ErrNoEvictable }

// Stats are the engine's counters.
type Stats struct {
	// Evictions counts storages dropped by the budget loop and Reclaim.
	Evictions int64 `json:"evictions"`
	// EagerEvictions counts storages dropped because their last reference
	// was released.
	EagerEvictions int64 `json:"eager_evictions"`
	// Banished counts storages released for good.
	Banished int64 `json:"banished"`
	// Rematerializations counts ops re-run.
	Rematerializations int64 `json:"rematerializations"`
	// SwapsOut and SwapsIn count storage copies to and from host memory.
	SwapsOut int64 `json:"swaps_out"`
	SwapsIn  int64 `json:"swaps_in"`
	// BaseCostNS is the cost of the ops as first run.
	BaseCostNS int64 `json:"base_cost_ns"`
	// RematCostNS is the cost of the re-runs.
	RematCostNS int64 `json:"remat_cost_ns"`
	// SwapCostNS is the modelled transfer time of swaps.
	SwapCostNS int64 `json:"swap_cost_ns"`
	// Clock is the engine clock (1 + all costs), the staleness time base.
	Clock int64 `json:"clock"`
	// Usage is the memory in use now, PeakUsage the highest seen, both in
	// the units of the budget: with a usage source (Config.Usage, the
	// allocator's allocated bytes) its highest value since the engine was
	// created (Config.UsagePeak, else what Evict sampled), so a budget set
	// from a probe's PeakUsage is comparable. PeakResident is the highest sum
	// of resident registered bytes, whatever the source.
	Usage        uint64 `json:"usage"`
	PeakUsage    uint64 `json:"peak_usage"`
	PeakResident uint64 `json:"peak_resident"`
	// Budget is the budget in force (0 = unlimited; 0 with Config.Stress,
	// which ignores the budget).
	Budget uint64 `json:"budget"`
	// MinBudget is the step's minimum budget so far (MinBudgetParts.Bytes),
	// MinBudgetParts its parts (see Engine.MinBudget).
	MinBudget      uint64         `json:"min_budget"`
	MinBudgetParts MinBudgetParts `json:"min_budget_parts"`
	// Candidates is the number of storages that could be evicted now.
	Candidates int `json:"candidates"`
	// VictimSearches and VictimSearchNS count victim selections and the
	// wall time spent in them.
	VictimSearches int64 `json:"victim_searches"`
	VictimSearchNS int64 `json:"victim_search_ns"`
	// Tensors, Storages and Ops count what the lineage graph holds.
	Tensors  int `json:"tensors"`
	Storages int `json:"storages"`
	Ops      int `json:"ops"`
	// Heuristic is the heuristic in use.
	Heuristic string `json:"heuristic"`
	// BytesEvicted is the sum of the sizes of the victims of the budget
	// loop and of Reclaim (drops and swaps out; not eager evictions or
	// banished storages).
	BytesEvicted uint64 `json:"bytes_evicted"`
	// ReclaimVictims counts the victims Reclaim chose (also counted in
	// Evictions or SwapsOut, and in BytesEvicted).
	ReclaimVictims int64 `json:"reclaim_victims"`
	// ReclaimShortfalls counts the Reclaim calls that ran out of
	// candidates before they found the bytes asked for.
	ReclaimShortfalls int64 `json:"reclaim_shortfalls"`
	// ReserveEvictions counts the victims of the budget loop, EvictOne
	// and Reclaim that were reserve candidates: storages a re-run step of
	// an open plan still read, taken because no ordinary candidate was
	// left (also counted in Evictions or SwapsOut).
	ReserveEvictions int64 `json:"reserve_evictions"`
	// Parked counts the storages parked in host memory (Config.Park):
	// reserve victims swapped instead of dropped, and locked storages Park
	// swapped out (also counted in SwapsOut).
	Parked int64 `json:"parked"`
	// Auto reports that the engine runs the tuning policy (heuristic
	// "auto"): it records its step for package autotune.
	Auto bool `json:"auto"`
	// Finished reports that Finish was called.
	Finished bool `json:"finished"`
}

// Engine is the DTR engine: the lineage graph plus the eviction policy.
//
// An engine is finished once Finish is called: the program's step is over
// and the caller is about to make every tensor that escapes it resident.
// The budget still binds (a run never goes over it before raising): when
// what leaves the step does not fit, Evict fails and its error says so.
type Engine struct {
	cfg   Config
	h     Heuristic
	g     *rc.Graph
	tr    tracker
	sel   selector
	stale bool
	// parked holds candidates pick set aside because they cannot be
	// recomputed and their swap would pass Config.OffloadLimit; parkedAt is
	// the swapped bytes when the last one was set aside.
	parked   []rc.StorageID
	parkedAt uint64
	tf       float64
	mf       float64

	clock   int64
	usage   uint64
	peak    uint64
	sampled uint64 // with a usage source: the highest usage Evict read
	stats   Stats
	pending []Victim // eager victims not yet handed out
	pendAt  int
	plans   []planHold // committed plans not run to the end, innermost last
	// soft are the soft plan holds (planhold.go): per storage, the reads
	// of it by the re-run steps of the open plans not reported yet, and
	// the next of them to run; grown only by HoldPlan.
	soft    softHolds
	scratch []rc.StorageID
	rec     *recorder // nil unless cfg.Record
	// finished is set by Finish: the budget loop's errors name what leaves
	// the step.
	finished bool
	// reclaimGot is the bytes written by an open Reclaim (one whose last
	// call filled its out), 0 when none is open.
	reclaimGot uint64
	// shortfall is ReclaimShortfall: why the last Reclaim fell short.
	shortfall string
	// flags are per-storage bits (flagRegPin, flagRebuilt, flagQueued),
	// grown only when a bit is set: storages past its end have none.
	flags []uint8
	// pinnedReg and pinnedLater are the bytes of the resident pinned
	// storages, pinned at registration (NewTensor) and later (Pin); small
	// those of the resident unpinned storages under Config.EvicteeMinSize
	// (never evicted: part of what must fit, like the pinned ones).
	pinnedReg, pinnedLater, small uint64
	// minBudget is the step's minimum budget so far (MinBudget).
	minBudget MinBudgetParts
	// stressQ[stressAt:] are the storages that became candidates, with
	// Config.Stress, since the last Evict looked (stress.go).
	stressQ  []rc.StorageID
	stressAt int
}

// New returns an engine.
func New(cfg Config) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, h: cfg.Heuristic.Resolve(), g: rc.NewGraph(), clock: 1}
	e.g.Reserve(cfg.Reserve.Ops, cfg.Reserve.Tensors, cfg.Reserve.Storages)
	e.stale = e.h.stale()
	e.tf, e.mf = cfg.RecompTimeFactor, cfg.RecompMemoryFactor
	if e.tf == 0 {
		e.tf = 1
	}
	if e.mf == 0 {
		e.mf = 1
	}
	switch e.h {
	case DTR:
		e.tr = newRegionTracker(e.g, true)
	case MSPS, AncSqrt:
		e.tr = newRegionTracker(e.g, false)
	case DTREq:
		e.tr = newEqTracker(e.g, false)
	case DTREqAnc:
		e.tr = newEqTracker(e.g, true)
	default:
		e.tr = newLocalTracker(e.g)
	}
	if cfg.ExactScan {
		e.sel = newScanSelector(e)
	} else {
		z := newLazySelector(e)
		z.set.reserve(cfg.Reserve.Storages)
		e.sel = z
	}
	e.tr.setLowered(e.sel.lowered, e.sel.fell)
	if cfg.Record || cfg.Heuristic == Auto {
		e.rec = &recorder{limit: MaxRecordedInstructions}
	}
	return e, nil
}

// Graph returns the lineage graph (read-only for callers).
func (e *Engine) Graph() *rc.Graph { return e.g }

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// Heuristic returns the heuristic in use (Default resolved).
func (e *Engine) Heuristic() Heuristic { return e.h }

// Clock returns the engine clock: 1 + the cost of everything run so far.
func (e *Engine) Clock() int64 { return e.clock }

// Budget returns the budget (0 = unlimited).
func (e *Engine) Budget() uint64 { return e.cfg.Budget }

// SetBudget changes the budget (0 = unlimited). The next Evict applies it.
func (e *Engine) SetBudget(b uint64) { e.cfg.Budget = b }

// Usage returns the memory in use: the configured usage source, or the bytes
// of resident storages.
func (e *Engine) Usage() uint64 {
	if e.cfg.Usage != nil {
		return e.cfg.Usage()
	}
	return e.usage
}

// ResidentBytes returns the bytes of resident storages, whatever the usage
// source.
func (e *Engine) ResidentBytes() uint64 { return e.usage }

// tick advances the clock by d nanoseconds and adds d to the counter c,
// both saturating at math.MaxInt64: a clock pinned at its end keeps every
// staleness non-negative and every score defined.
func (e *Engine) tick(c *int64, d int64) {
	e.clock = satmath.AddInt64(e.clock, d)
	*c = satmath.AddInt64(*c, d)
}

func (e *Engine) grow(n uint64) {
	e.usage += n
	if e.usage > e.peak {
		e.peak = e.usage
	}
}

func (e *Engine) tensor(t rc.TensorID) (*rc.Tensor, error) {
	if err := e.g.CheckTensor(t); err != nil {
		return nil, err
	}
	return e.g.Tensor(t), nil
}

// Candidates returns the number of storages that can be evicted now.
func (e *Engine) Candidates() int { return e.sel.len() }

// Pending returns the number of storages the engine freed (released,
// banished, throw-away copies of a re-run) that Evict has not handed out
// yet.
func (e *Engine) Pending() int { return len(e.pending) - e.pendAt }

// Status is the part of Stats a caller reads after every call (the C ABI's
// status block): no formatting, no counting, nothing allocated.
type Status struct {
	Usage, Budget, PeakUsage uint64
	BytesEvicted             uint64
}

// Status returns usage, budget, peak and bytes evicted exactly as Stats
// reports them, at the cost of a few loads.
func (e *Engine) Status() Status {
	st := Status{Usage: e.Usage(), PeakUsage: e.peak, BytesEvicted: e.stats.BytesEvicted}
	if e.cfg.Usage != nil {
		st.PeakUsage = max(e.sampled, st.Usage)
		if e.cfg.UsagePeak != nil {
			st.PeakUsage = max(st.PeakUsage, e.cfg.UsagePeak())
		}
	}
	if !e.cfg.Stress {
		st.Budget = e.cfg.Budget
	}
	return st
}

// Stats returns the counters.
func (e *Engine) Stats() Stats {
	s := e.stats
	s.Clock = e.clock
	st := e.Status()
	s.Usage, s.PeakUsage, s.Budget, s.PeakResident = st.Usage, st.PeakUsage, st.Budget, e.peak
	s.MinBudget, s.MinBudgetParts = e.minBudget.Bytes(), e.minBudget
	s.Candidates = e.sel.len()
	s.Tensors = e.g.NumTensors()
	s.Storages = e.g.NumStorages()
	s.Ops = e.g.NumOps()
	s.Heuristic = e.h.String()
	s.Auto = e.cfg.Heuristic == Auto
	s.Finished = e.finished
	return s
}
