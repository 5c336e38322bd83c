// Package evict is memscale's Dynamic Tensor Rematerialization policy: the
// candidate set, the eviction heuristics (h_DTR e*, h_DTR^eq, h_DTR^local,
// h_MSPS, LRU, size, and memscale's default), the candidate index, the budget
// loop with its swap-or-recompute decision, eager eviction and banishing of
// released tensors, and the Engine facade that both the C ABI
// (memscale_dtr_*) and the trace replay runtime drive.
//
// An Engine is not safe for concurrent use; the C ABI serializes calls per
// handle.
package evict

import (
	"errors"
	"fmt"
	"math"
	"time"

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

// Config configures an Engine.
type Config struct {
	// Budget is the memory budget in bytes; 0 means unlimited.
	Budget uint64
	// Heuristic chooses victims (Default = DefaultHeuristic).
	Heuristic Heuristic
	// RecompTimeFactor is the exponent on the cost term (0 means 1).
	RecompTimeFactor float64
	// RecompMemoryFactor is the exponent on the size term (0 means 1).
	RecompMemoryFactor float64
	// EvicteeMinSize keeps storages smaller than this out of the candidate
	// set.
	EvicteeMinSize uint64
	// SwapBandwidth is the host<->device bandwidth in bytes/s used for the
	// swap-or-recompute decision; 0 means never swap.
	SwapBandwidth float64
	// Usage, when set, reports the memory in use (e.g. the allocator's
	// allocated bytes); otherwise the engine counts the bytes of resident
	// storages.
	Usage func() uint64
	// SimulatorCompat reproduces the DTR authors' simulator
	// (RuntimeV2EagerOptimized) exactly: a released storage is dropped but
	// stays recomputable forever, a pinned storage stays resident after its
	// last reference is released, and zero-byte storages are candidates.
	// By default a released storage whose dependents are all released is
	// banished (freed and forgotten), which frees released parameters and
	// keeps neighbourhood costs honest, and zero-byte storages are never
	// victims (evicting them frees nothing).
	SimulatorCompat bool
	// DropNeededReleased turns off a default of the engine: a released
	// storage (no references left) that an evicted, still referenced storage
	// was computed from directly is kept - it is not evicted when its last
	// reference goes, and it does not rank
	// before every referenced storage, but stays an ordinary candidate
	// scored by the heuristic, until that storage is rebuilt, released or
	// banished. Without it, DTR may evict a storage that is cheap to rebuild
	// only because its parent is resident (a gradient whose parent is
	// locked while the backward op that reads it runs), then drop the
	// parent as soon as the program releases it, which makes the rebuild
	// re-run everything the parent came from (a deep chain: the whole
	// forward and backward so far, rebuilt one nested plan per layer).
	// SimulatorCompat implies it (the DTR authors' simulator drops released
	// storages at once). Setting it measures what the default is worth.
	DropNeededReleased bool
	// Record keeps the program the engine is told about (Recording), so
	// that the step can be replayed under other configurations (package
	// autotune). It costs about 100 bytes per op.
	Record bool
	// ExactScan chooses victims by scanning every candidate instead of
	// using the index (same result, slower; for tests and measurements).
	ExactScan bool
	// OnEvict, when set, is called for every storage the engine takes out
	// of device memory: budget victims, eager evictions and banished
	// storages (observability and debugging).
	OnEvict func(v Victim, why EvictReason)
}

// EvictReason says why a storage left device memory.
type EvictReason uint8

// Eviction reasons.
const (
	// ReasonBudget: chosen by the budget loop.
	ReasonBudget EvictReason = iota
	// ReasonEager: its last reference was released.
	ReasonEager
	// ReasonBanish: released for good.
	ReasonBanish
)

func (c Config) validate() error {
	if c.Heuristic >= numHeuristics {
		return fmt.Errorf("evict: unknown heuristic %d", c.Heuristic)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"recomp_time_factor", c.RecompTimeFactor}, {"recomp_memory_factor", c.RecompMemoryFactor}, {"swap_bandwidth", c.SwapBandwidth}} {
		if f.v < 0 || math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			return fmt.Errorf("evict: %s %v: must be a finite number >= 0", f.name, f.v)
		}
	}
	return nil
}

// Stats are the engine's counters.
type Stats struct {
	// Evictions counts storages dropped by the budget loop.
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
	// Usage is the memory in use now, PeakUsage the highest seen.
	Usage     uint64 `json:"usage"`
	PeakUsage uint64 `json:"peak_usage"`
	// Budget is the budget (0 = unlimited).
	Budget uint64 `json:"budget"`
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
}

// Engine is the DTR engine: the lineage graph plus the eviction policy.
type Engine struct {
	cfg   Config
	h     Heuristic
	g     *rc.Graph
	tr    tracker
	sel   selector
	stale bool
	tf    float64
	mf    float64

	clock   int64
	usage   uint64
	peak    uint64
	stats   Stats
	pending []Victim // eager victims not yet handed out
	pendAt  int
	plans   []planHold // committed plans not run to the end, innermost last
	scratch []rc.StorageID
	rec     *recorder // nil unless cfg.Record
}

// New returns an engine.
func New(cfg Config) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, h: cfg.Heuristic.Resolve(), g: rc.NewGraph(), clock: 1}
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
		e.sel = newIndexSelector(e)
	}
	e.tr.setLowered(e.sel.lowered)
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

// NewTensor registers an external tensor (an input or parameter) of nbytes,
// resident, holding one reference. A pinned tensor is never evicted; an
// unpinned one can only be swapped (it has no lineage to recompute it from).
func (e *Engine) NewTensor(nbytes uint64, pinned bool) rc.TensorID {
	t := e.g.AddExternal(nbytes, e.clock)
	s := e.g.Tensor(t).Storage
	if pinned {
		e.g.Storage(s).Pins++
	}
	e.grow(nbytes)
	e.refresh(s)
	e.recConstant(t, nbytes)
	return t
}

// Output describes one output of an op for Call.
type Output = rc.OutSpec

// Call records that an op ran: it read inputs (all resident), took cost
// nanoseconds, and produced outputs (fresh storage or views of an input). The
// outputs are resident, hold one reference each, count as accessed at the
// clock after the op, and are returned in order. Reads of the inputs are
// reported with Access (the C ABI does it for every input before Call).
func (e *Engine) Call(name string, inputs []rc.TensorID, outs []Output, cost int64, flags rc.OpFlags) (rc.OpID, []rc.TensorID, error) {
	op, ids, err := e.call(name, inputs, outs, cost, flags)
	if err == nil {
		e.recCall(name, inputs, outs, cost, ids)
	}
	return op, ids, err
}

func (e *Engine) call(name string, inputs []rc.TensorID, outs []Output, cost int64, flags rc.OpFlags) (rc.OpID, []rc.TensorID, error) {
	start := e.clock
	op, err := e.g.AddOp(name, inputs, outs, cost, flags, start+cost)
	if err != nil {
		return 0, nil, fmt.Errorf("evict: call: %w", err)
	}
	e.clock = start + cost
	e.stats.BaseCostNS += cost
	o := e.g.Op(op)
	var fresh uint64
	for _, out := range o.Outputs {
		x := e.g.Tensor(out)
		s := e.g.Storage(x.Storage)
		s.LastAccess = e.clock
		if x.Alias < 0 {
			fresh += s.Size
		}
	}
	e.grow(fresh)
	e.tr.added(op)
	// The simulator appends new candidates siblings first, then the first
	// output; keep that order (it breaks ties).
	for i := 1; i <= len(o.Outputs); i++ {
		e.refresh(e.g.Tensor(o.Outputs[i%len(o.Outputs)]).Storage)
	}
	return op, o.Outputs, nil
}

// Mutate records an in-place op: it read inputs and overwrote the ones at
// the mutated indices. Each mutated input gets a new version (returned in
// order) that takes over its memory and its pins; the old version's value is
// gone, so its storage counts as evicted without being freed (it is rebuilt
// by recomputation if anything needs it, or is lost if it cannot be
// recomputed), and it loses one reference as the new version gains one.
func (e *Engine) Mutate(name string, inputs []rc.TensorID, mutated []int, cost int64, flags rc.OpFlags) (rc.OpID, []rc.TensorID, error) {
	outs := make([]Output, len(mutated))
	for i, m := range mutated {
		if m < 0 || m >= len(inputs) {
			return 0, nil, fmt.Errorf("evict: mutate %s: mutated index %d out of range (%d inputs)", name, m, len(inputs))
		}
		for _, p := range mutated[:i] {
			if p == m {
				return 0, nil, fmt.Errorf("evict: mutate %s: mutated index %d listed twice", name, m)
			}
		}
		if err := e.g.CheckTensor(inputs[m]); err != nil {
			return 0, nil, fmt.Errorf("evict: mutate %s: %w", name, err)
		}
		outs[i] = Output{Size: e.g.StorageOf(inputs[m]).Size, Alias: -1}
	}
	peak := e.peak
	op, ids, err := e.call(name, inputs, outs, cost, flags)
	if err != nil {
		return 0, nil, err
	}
	e.recMutate(name, inputs, mutated, cost, ids)
	for i, m := range mutated {
		old := e.g.Tensor(inputs[m]).Storage
		nw := e.g.Tensor(ids[i]).Storage
		os, ns := e.g.Storage(old), e.g.Storage(nw)
		ns.Pins, os.Pins = ns.Pins+os.Pins, 0
		// The new version lives in the old memory: dropping the old
		// storage gives back the bytes Call counted for the new one. The
		// old value is recomputed if something needs it; if it cannot be
		// (NoRecompute), planning for it fails and says so.
		if os.State == rc.Resident {
			e.dropStorage(old)
		} else {
			// an earlier mutated input shared the storage and dropped
			// it already; this version reuses the same memory too
			e.usage -= ns.Size
		}
		e.refresh(nw)
	}
	e.peak = max(peak, e.usage)
	for _, m := range mutated {
		if err := e.release(inputs[m]); err != nil {
			return 0, nil, fmt.Errorf("evict: mutate %s: %w", name, err)
		}
	}
	return op, ids, nil
}

// dropStorage marks s evicted (no victim is queued).
func (e *Engine) dropStorage(s rc.StorageID) {
	st := e.g.Storage(s)
	e.g.Drop(s)
	e.usage -= st.Size
	e.sel.remove(s)
	e.tr.dropped(s)
}

// Access records that tensor t was read now (the staleness clock).
func (e *Engine) Access(t rc.TensorID) error {
	if _, err := e.tensor(t); err != nil {
		return fmt.Errorf("evict: access: %w", err)
	}
	e.g.StorageOf(t).LastAccess = e.clock
	return nil
}

// Lock keeps t's storage from being evicted until the matching Unlock.
func (e *Engine) Lock(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: lock: %w", err)
	}
	e.g.Storage(x.Storage).Locks++
	e.refresh(x.Storage)
	return nil
}

// Unlock releases one Lock of t's storage.
func (e *Engine) Unlock(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: unlock: %w", err)
	}
	return e.unlockStorage(x.Storage)
}

func (e *Engine) unlockStorage(s rc.StorageID) error {
	st := e.g.Storage(s)
	if st.Locks <= 0 {
		return fmt.Errorf("evict: unlock: storage of tensor %d is not locked", st.Root)
	}
	st.Locks--
	if st.Locks == 0 && st.Refs == 0 {
		e.unreferenced(s, false)
	}
	e.refresh(s)
	return nil
}

// Pin keeps t's storage resident for good. t must be resident.
func (e *Engine) Pin(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: pin: %w", err)
	}
	if !e.g.IsResident(t) {
		return fmt.Errorf("evict: pin: tensor %d is not resident (storage %s)", t, e.g.Storage(x.Storage).State)
	}
	e.g.Storage(x.Storage).Pins++
	e.refresh(x.Storage)
	e.recRef(rc.KindPin, t)
	return nil
}

// Unpin releases one Pin of t's storage.
func (e *Engine) Unpin(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: unpin: %w", err)
	}
	st := e.g.Storage(x.Storage)
	if st.Pins <= 0 {
		return fmt.Errorf("evict: unpin: tensor %d is not pinned", t)
	}
	st.Pins--
	if st.Pins == 0 && st.Refs == 0 && st.Locks == 0 {
		e.unreferenced(x.Storage, true)
	}
	e.refresh(x.Storage)
	return nil
}

// Retain adds a reference to t (the program made another name for it). t
// must hold a reference already.
func (e *Engine) Retain(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: retain: %w", err)
	}
	st := e.g.Storage(x.Storage)
	if x.Refs <= 0 {
		return fmt.Errorf("evict: retain: tensor %d has no references left (it was released)", t)
	}
	x.Refs++
	st.Refs++
	e.recRef(rc.KindCopy, t)
	return nil
}

// Release drops one reference to t. When its storage has no references left
// it is evicted at once (eager eviction) if it can be recomputed, and
// banished (freed for good) once nothing that is still referenced can need
// it. Storages freed this way are handed out by the next Evict call.
func (e *Engine) Release(t rc.TensorID) error {
	if err := e.release(t); err != nil {
		return err
	}
	e.recRef(rc.KindRelease, t)
	return nil
}

func (e *Engine) release(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: release: %w", err)
	}
	if x.Refs <= 0 {
		return fmt.Errorf("evict: release: tensor %d has no references left", t)
	}
	x.Refs--
	st := e.g.Storage(x.Storage)
	st.Refs--
	if st.Refs == 0 {
		e.unreferenced(x.Storage, st.Locks == 0)
	}
	return nil
}

// unreferenced handles a storage that has no references: left by Release
// (released), or by Unlock of a storage that was rebuilt only to recompute
// something else, or released while locked. A locked storage is handled when
// its last lock goes. In default mode a storage nothing can need any more
// (no live dependents) is banished, and with an unlimited budget every
// unreferenced storage is freed. Otherwise a storage whose last reference
// was just released is dropped at once if it is resident and recomputable
// (eager eviction; it stays recomputable for its dependents), and one that
// was only rebuilt stays resident as a candidate that goes before any
// referenced storage (see key); in simulator mode as an ordinary candidate.
// Unless DropNeededReleased, one that an evicted referenced storage was
// computed from is neither dropped nor ranked first (see feedsEvicted).
func (e *Engine) unreferenced(s rc.StorageID, released bool) {
	st := e.g.Storage(s)
	if st.State == rc.Released || st.Locks > 0 {
		return
	}
	if !e.cfg.SimulatorCompat {
		switch {
		case e.cfg.Budget == 0:
			// Nothing will be evicted, so nothing needs the lineage of
			// an unreferenced storage: free it now. Its dependents lose
			// the ability to be recomputed, should a budget be set later.
			e.detach(s)
			return
		case st.LiveChildren == 0:
			e.banish(s)
			return
		}
	}
	if released && st.State == rc.Resident && st.Pins == 0 && !st.NoRecompute && !e.feedsEvicted(st) {
		e.dropStorage(s)
		e.stats.EagerEvictions++
		e.queue(Victim{Tensor: st.Root, Action: Drop, Size: st.Size}, ReasonEager)
		return
	}
	if st.State == rc.Evicted {
		e.notNeeded(s) // its resident released parents may rank first now
	}
	e.sel.lowered(s) // its key now sorts it first (unless keepNeeded keeps it)
}

func (e *Engine) queue(v Victim, why EvictReason) {
	if e.cfg.OnEvict != nil {
		e.cfg.OnEvict(v, why)
	}
	if e.pendAt == len(e.pending) {
		e.pending, e.pendAt = e.pending[:0], 0
	}
	e.pending = append(e.pending, v)
}

// detach frees s for good and makes its dependents non-recomputable.
func (e *Engine) detach(s rc.StorageID) {
	st := e.g.Storage(s)
	for _, c := range st.Children {
		cs := e.g.Storage(c)
		if cs.State != rc.Released && !cs.NoRecompute {
			cs.NoRecompute = true
			e.refresh(c)
		}
	}
	e.banish(s)
}

// banish frees s for good, then every parent that is left with no
// references and no live children.
func (e *Engine) banish(s rc.StorageID) {
	work := append(e.scratch[:0], s)
	for len(work) > 0 {
		s := work[len(work)-1]
		work = work[:len(work)-1]
		st := e.g.Storage(s)
		if st.State == rc.Released {
			continue
		}
		prev := st.State
		if prev == rc.Resident {
			e.usage -= st.Size
		}
		if prev == rc.Resident || prev == rc.Swapped {
			e.queue(Victim{Tensor: st.Root, Action: Drop, Size: st.Size}, ReasonBanish)
		}
		e.sel.remove(s)
		e.g.Release(s)
		e.tr.released(s, prev)
		e.stats.Banished++
		for _, p := range st.Parents {
			ps := e.g.Storage(p)
			if prev == rc.Evicted {
				e.parentNotNeeded(ps, p)
			}
			ps.LiveChildren--
			if ps.LiveChildren == 0 && ps.Refs == 0 && ps.Locks == 0 && ps.State != rc.Released && !e.cfg.SimulatorCompat {
				work = append(work, p)
			}
		}
	}
	e.scratch = work[:0]
}

// eligible reports whether s may be chosen as a victim.
func (e *Engine) eligible(st *rc.Storage) bool {
	return st.State == rc.Resident && st.Locks == 0 && st.Pins == 0 && (st.Size > 0 || e.cfg.SimulatorCompat) &&
		st.Size >= e.cfg.EvicteeMinSize && (!st.NoRecompute || e.cfg.SwapBandwidth > 0)
}

// refresh puts s into or out of the candidate set after a change.
func (e *Engine) refresh(s rc.StorageID) {
	if e.eligible(e.g.Storage(s)) {
		e.sel.add(s)
	} else {
		e.sel.remove(s)
	}
}

// key returns s's current (true) key.
func (e *Engine) key(s rc.StorageID) key { return e.keyOf(s, true) }

// lowKey returns a key that never sorts s later than its true key does: the
// same key with the tracker's cheap lower bound of the cost in place of the
// cost (see tracker.bound). The candidate index stores it when a storage
// becomes a candidate or its score may have fallen, and computes the true
// key only for a storage about to be chosen. Where the bound might not
// order like the cost (a recomp_time_factor exponent, whose math.Pow is not
// guaranteed monotonic to the last bit, or a zero size, where both would
// divide by zero) it is the true key.
func (e *Engine) lowKey(s rc.StorageID) key {
	return e.keyOf(s, e.tf != 1 || e.g.Storage(s).Size == 0)
}

// keyOf returns s's key with the cost (exact) or its lower bound.
func (e *Engine) keyOf(s rc.StorageID, exact bool) key {
	st := e.g.Storage(s)
	k := key{l: st.LastAccess, id: int32(s), dead: st.Refs == 0 && !e.cfg.SimulatorCompat && !e.feedsEvicted(st)}
	m := float64(st.Size)
	if e.mf != 1 {
		m = math.Pow(m, e.mf)
	}
	switch e.h {
	case LRU:
		k.a = 1
	case Size:
		k.a = 1 / m
	default:
		var c float64
		if exact {
			c = float64(e.tr.cost(s))
		} else {
			c = float64(e.tr.bound(s))
		}
		if e.tf != 1 {
			c = math.Pow(c, e.tf)
		}
		k.a = c / m
		if e.h == AncSqrt {
			// a/sqrt(s) orders like a^2/s: keep the exact comparator
			k.a *= k.a
		}
	}
	return k
}

// Score returns t's storage's current heuristic score (lower = evicted
// first; +Inf when it was used at this very clock).
func (e *Engine) Score(t rc.TensorID) (float64, error) {
	x, err := e.tensor(t)
	if err != nil {
		return 0, fmt.Errorf("evict: score: %w", err)
	}
	sc := e.key(x.Storage).score(e.clock, e.stale)
	if e.h == AncSqrt {
		sc = math.Sqrt(sc)
	}
	return sc, nil
}

// Candidates returns the number of storages that can be evicted now.
func (e *Engine) Candidates() int { return e.sel.len() }

// Evict is the budget loop. It first hands out storages freed by Release
// since the last call, then, while usage + extra is over the budget, chooses
// victims, marks them evicted (or swapped) and writes them to out, up to
// len(out). If it returns len(out), call again. It fails, wrapping
// ErrNoEvictable and naming usage and budget, only when usage + extra is
// over the budget, nothing is evictable and nothing was written.
func (e *Engine) Evict(extra uint64, out []Victim) (int, error) {
	n := 0
	for n < len(out) && e.pendAt < len(e.pending) {
		out[n] = e.pending[e.pendAt]
		e.pendAt++
		n++
	}
	if e.cfg.Budget == 0 {
		return n, nil
	}
	var gone uint64 // bytes evicted here that an external usage source still counts
	for n < len(out) {
		u := e.Usage()
		if e.cfg.Usage != nil {
			u = sub(u, gone)
		}
		if u+extra <= e.cfg.Budget {
			break
		}
		s, ok := e.pick()
		if !ok {
			if n > 0 {
				break
			}
			return 0, fmt.Errorf("evict: usage %d + %d requested > budget %d: %w (%s)",
				u, extra, e.cfg.Budget, ErrNoEvictable, e.whyNoneEvictable())
		}
		out[n] = e.evictStorage(s)
		if e.cfg.OnEvict != nil {
			e.cfg.OnEvict(out[n], ReasonBudget)
		}
		gone += out[n].Size
		n++
	}
	return n, nil
}

// EvictOne evicts the best victim regardless of the budget (for a memory
// model that failed to place a block although the budget allows it).
func (e *Engine) EvictOne() (Victim, error) {
	s, ok := e.pick()
	if !ok {
		return Victim{}, fmt.Errorf("evict: usage %d, budget %d: %w", e.Usage(), e.cfg.Budget, ErrNoEvictable)
	}
	v := e.evictStorage(s)
	if e.cfg.OnEvict != nil {
		e.cfg.OnEvict(v, ReasonBudget)
	}
	return v, nil
}

func sub(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

func (e *Engine) pick() (rc.StorageID, bool) {
	t0 := time.Now()
	s, ok := e.sel.pick(e.clock)
	e.stats.VictimSearches++
	e.stats.VictimSearchNS += int64(time.Since(t0))
	return s, ok
}

// transferNS is the modelled one-way copy time of n bytes.
func (e *Engine) transferNS(n uint64) int64 {
	return int64(float64(n) / e.cfg.SwapBandwidth * 1e9)
}

// evictStorage takes the victim s out of memory and says how.
func (e *Engine) evictStorage(s rc.StorageID) Victim {
	st := e.g.Storage(s)
	v := Victim{Tensor: st.Root, Action: Drop, Size: st.Size}
	if e.cfg.SwapBandwidth > 0 {
		// swap when copying out and back is cheaper than recomputing
		if st.NoRecompute || 2*e.transferNS(st.Size) < e.tr.cost(s) {
			v.Action = Swap
		}
	}
	if v.Action == Swap {
		e.sel.remove(s)
		e.g.SwapOut(s)
		e.usage -= st.Size
		e.stats.SwapsOut++
		d := e.transferNS(st.Size)
		e.stats.SwapCostNS += d
		e.clock += d
		return v
	}
	e.dropStorage(s)
	e.stats.Evictions++
	return v
}

// Plan returns the steps that make t resident (empty when it is), evicted
// ancestors first, appended to buf. It changes nothing; HoldPlan commits it.
func (e *Engine) Plan(t rc.TensorID, buf []rc.Step) ([]rc.Step, error) {
	steps, err := e.g.Plan(t, buf)
	if err != nil {
		return buf, fmt.Errorf("evict: plan: %w", err)
	}
	return steps, nil
}

// Rematerialized records that op ran again, taking cost nanoseconds (a
// negative cost means the cost recorded when it first ran). Its inputs must be
// resident; all its outputs become resident, except an output whose storage
// was released for good (the program dropped it and nothing can need it):
// the re-run made a throw-away copy of it, which the next Evict hands out to
// be freed. If the op is the held step of a committed plan (HoldPlan), the
// plan moves on to its next step.
func (e *Engine) Rematerialized(op rc.OpID, cost int64) error {
	return e.RematerializedFor(op, -1, cost)
}

// RematerializedFor is Rematerialized for a re-run done to rebuild output
// target (-1 if none in particular): the other outputs become candidates
// first, then target, which is the order the simulator uses to break ties.
func (e *Engine) RematerializedFor(op rc.OpID, target rc.TensorID, cost int64) error {
	if err := e.g.CheckOp(op); err != nil {
		return fmt.Errorf("evict: rematerialized: %w", err)
	}
	o := e.g.Op(op)
	if cost < 0 {
		cost = o.Cost
	}
	newly, dup, err := e.g.Rerun(op, e.scratch[:0])
	if err != nil {
		return fmt.Errorf("evict: rematerialized: %w", err)
	}
	e.clock += cost
	e.stats.RematCostNS += cost
	e.stats.Rematerializations++
	var added uint64
	for _, s := range newly {
		added += e.g.Storage(s).Size
	}
	if e.usage+added+dup > e.peak {
		e.peak = e.usage + added + dup
	}
	e.usage += added
	e.tr.resident(newly)
	for _, s := range newly {
		e.notNeeded(s)
	}
	if len(o.Outputs) > 1 {
		// Throw-away copies of released outputs: the caller frees them.
		for _, out := range o.Outputs {
			x := e.g.Tensor(out)
			if st := e.g.Storage(x.Storage); x.Alias < 0 && st.State == rc.Released {
				e.queue(Victim{Tensor: st.Root, Action: Drop, Size: st.Size}, ReasonBanish)
			}
		}
	}
	var last rc.StorageID = -1
	if target >= 0 {
		last = e.g.Tensor(target).Storage
	}
	for _, s := range newly {
		if s != last {
			e.refresh(s)
		}
	}
	if last >= 0 {
		e.refresh(last)
	}
	e.scratch = newly[:0]
	if len(e.plans) > 0 {
		if err := e.planStepDone(rc.Step{Kind: rc.StepRerun, Op: op}); err != nil {
			return fmt.Errorf("evict: rematerialized: %w", err)
		}
	}
	return nil
}

// SwappedIn records that the swapped storage of t was copied back.
func (e *Engine) SwappedIn(t rc.TensorID) error {
	x, err := e.tensor(t)
	if err != nil {
		return fmt.Errorf("evict: swapped in: %w", err)
	}
	st := e.g.Storage(x.Storage)
	if st.State != rc.Swapped {
		return fmt.Errorf("evict: swapped in: storage of tensor %d is %s, not swapped", t, st.State)
	}
	e.g.SwapIn(x.Storage)
	e.grow(st.Size)
	e.stats.SwapsIn++
	if e.cfg.SwapBandwidth > 0 {
		d := e.transferNS(st.Size)
		e.stats.SwapCostNS += d
		e.clock += d
	}
	e.refresh(x.Storage)
	if len(e.plans) > 0 {
		if err := e.planStepDone(rc.Step{Kind: rc.StepSwapIn, Tensor: st.Root}); err != nil {
			return fmt.Errorf("evict: swapped in: %w", err)
		}
	}
	return nil
}

// Stats returns the counters.
func (e *Engine) Stats() Stats {
	s := e.stats
	s.Clock = e.clock
	s.Usage = e.Usage()
	s.PeakUsage = e.peak
	s.Budget = e.cfg.Budget
	s.Candidates = e.sel.len()
	s.Tensors = e.g.NumTensors()
	s.Storages = e.g.NumStorages()
	s.Ops = e.g.NumOps()
	s.Heuristic = e.h.String()
	return s
}
