// The engine's configuration and its defaults. See doc.go for the design.

package evict

import (
	"fmt"
	"math"
)

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
	// Park turns on parking: a reserve victim (a storage that a re-run step
	// of an open rematerialization plan still reads, taken because nothing
	// else was left) is copied to host memory instead of dropped, whatever
	// SwapBandwidth says, within OffloadLimit, and Engine.Park may take a
	// locked storage out. Dropped, a reserve victim would be rebuilt by a
	// plan of its own, nested inside the one that reads it, and nested plans
	// are what runs out of room at tight budgets; parked, it costs one copy
	// each way (timed on the clock with SwapBandwidth when it is set; no
	// bandwidth needs measuring for parking alone).
	Park bool
	// Reserve is the size of graph to make room for up front (the counts
	// of the previous step of the same program; zero: none).
	Reserve GraphSize
	// OffloadLimit caps the bytes swapped out to host memory at any time
	// (0: no cap). A recomputable victim that would pass it is dropped
	// instead; one that cannot be recomputed is not a candidate meanwhile.
	OffloadLimit uint64
	// Usage, when set, reports the memory in use (e.g. the allocator's
	// allocated bytes); otherwise the engine counts the bytes of resident
	// storages.
	Usage func() uint64
	// UsagePeak, with Usage, reports the highest Usage since the engine was
	// created (the allocator's watermark, which sees every allocation, an
	// op's temporaries included). Without it the peak is the highest Usage
	// the engine sampled (once per Evict call).
	UsagePeak func() uint64
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
	// Stress is a testing setting: every evictable storage is evicted as
	// soon as no running op needs it. Each Evict (the budget loop, which
	// the caller then calls after every op) evicts every eligible storage
	// (resident, unlocked, unpinned, at least EvicteeMinSize bytes,
	// recomputable or swappable) that has not been rematerialized or
	// swapped in during the engine's life, whatever the usage and the
	// budget (which it ignores; Stats reports a budget of 0), and never
	// fails. A storage rebuilt once is not evicted again by stress, so the
	// re-runs it causes stay linear in the program. It exercises every
	// rematerialization path of a program at once.
	Stress bool
	// ExactScan chooses victims by scanning every candidate instead of
	// using the index (same result, slower; for tests and measurements).
	ExactScan bool
	// OnEvict, when set, is called for every storage the engine takes out
	// of device memory: budget and Reclaim victims, eager evictions and
	// banished storages (observability and debugging).
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
	// ReasonReclaim: chosen by Reclaim (an allocation failed).
	ReasonReclaim
	// ReasonPark: a locked storage parked in host memory (Engine.Park).
	ReasonPark
)

func (c Config) validate() error {
	if c.Heuristic >= numHeuristics {
		return fmt.Errorf("evict: unknown heuristic %d", c.Heuristic)
	}
	if r := c.Reserve; r.Ops < 0 || r.Tensors < 0 || r.Storages < 0 || r.Ops > maxReserve || r.Tensors > maxReserve || r.Storages > maxReserve {
		return fmt.Errorf("evict: reserve %+v: want counts from 0 to %d", r, maxReserve)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"recomp_time_factor", c.RecompTimeFactor}, {"recomp_memory_factor", c.RecompMemoryFactor}} {
		if !(f.v >= 0 && f.v <= MaxRecompFactor) {
			return fmt.Errorf("evict: %s %v: must be a number from 0 (meaning 1) to %d: a larger exponent "+
				"overflows the score of an op that takes seconds (cost^%v)", f.name, f.v, MaxRecompFactor, f.v)
		}
	}
	if f := c.SwapBandwidth; f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("evict: swap_bandwidth %v: must be a finite number >= 0 (bytes/s; 0: never swap)", f)
	}
	return nil
}

// MaxRecompFactor is the largest recomp_time_factor and recomp_memory_factor
// accepted. A score is cost^T / size^M, squared by anc-sqrt; with costs up to
// 2^63 ns and sizes from 1 byte to 2^48 that square stays a finite, non-zero
// float64 only for exponents up to 8 (2^(63*8*2) < 2^1024). MegEngine's
// factors are around 1.
const MaxRecompFactor = 8

// GraphSize counts a step's ops, tensors and storages (Config.Reserve).
type GraphSize struct {
	Ops      int `json:"ops"`
	Tensors  int `json:"tensors"`
	Storages int `json:"storages"`
}

// UsageSource says where an engine created from JSON reads its memory usage.
type UsageSource struct {
	// Allocator is true for "usage": "allocator": the allocated bytes of the
	// allocator of Device. False means the engine counts resident bytes.
	Allocator bool
	// Device is the allocator's device ordinal.
	Device int
}

// maxReserve bounds Config.Reserve's counts (a bad value must not allocate
// without bound).
const maxReserve = 1 << 26

// RegionEvicteeMinSize is the minimum evictee size of a DTR region (the
// configuration key "defaults": "region"): storages smaller than this are
// never evicted by a region. Evicting a scalar such as a loss saves nothing
// and can cost a re-run of everything it came from.
const RegionEvicteeMinSize = 1024

// Defaults are what the settings of a configuration decoded by Decode
// default to: the engine's defaults with the environment's settings applied,
// and which of those the environment set. The DTR region's defaults
// ("defaults": "region") give way to the settings the environment made.
type Defaults struct {
	// Config is the base configuration: the engine's defaults with the
	// environment's settings (MEMSCALE_HEURISTIC, MEMSCALE_RECOMP_*_FACTOR,
	// MEMSCALE_EVICTEE_MIN_SIZE) applied.
	Config Config
	// HeuristicSet reports that MEMSCALE_HEURISTIC is set (not blank);
	// Config.Heuristic is its value.
	HeuristicSet bool
	// EvicteeMinSizeSet reports that MEMSCALE_EVICTEE_MIN_SIZE is set (not
	// blank); Config.EvicteeMinSize is its value.
	EvicteeMinSizeSet bool
}

// regionDefaults returns cfg with the DTR region's defaults for the
// settings the caller did not give (given reports whether a configuration
// key was given):
//   - evictee_min_size is RegionEvicteeMinSize (0 with Stress: a stress
//     run evicts storages of every size), unless the environment set it;
//   - heuristic is Auto (the tuning policy) when the budget is > 0 and the
//     environment did not set a heuristic or set "auto"; with a budget of 0
//     or Stress (nothing to tune for) it is Default in that case; a
//     heuristic the environment set to any other name stays.
func (d Defaults) regionDefaults(cfg Config, given func(key string) bool) Config {
	if !given("evictee_min_size") && !d.EvicteeMinSizeSet {
		cfg.EvicteeMinSize = RegionEvicteeMinSize
		if cfg.Stress {
			cfg.EvicteeMinSize = 0
		}
	}
	if !given("heuristic") && (!d.HeuristicSet || d.Config.Heuristic == Auto) {
		if cfg.Budget > 0 && !cfg.Stress {
			cfg.Heuristic = Auto
		} else {
			cfg.Heuristic = Default
		}
	}
	return cfg
}
