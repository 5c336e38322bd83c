package evict

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
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

// UsageSource says where an engine created from JSON reads its memory usage.
type UsageSource struct {
	// Allocator is true for "usage": "allocator": the allocated bytes of the
	// allocator of Device. False means the engine counts resident bytes.
	Allocator bool
	// Device is the allocator's device ordinal.
	Device int
}

// configKeys are the keys DecodeConfig accepts.
var configKeys = []string{
	"budget", "heuristic", "recomp_time_factor", "recomp_memory_factor",
	"evictee_min_size", "swap_bandwidth", "usage", "device", "simulator_compat",
	"keep_needed_released", "record",
}

// DecodeConfig parses the JSON configuration of memscale_dtr_create on top
// of base (the defaults, e.g. from the environment):
//
//	{"budget": bytes (0 = unlimited), "heuristic": name (see ParseHeuristic),
//	 "recomp_time_factor": f, "recomp_memory_factor": f,
//	 "evictee_min_size": bytes, "swap_bandwidth": bytes/s (0 = never swap),
//	 "usage": "engine" | "allocator", "device": ordinal (for "allocator"),
//	 "simulator_compat": bool, "keep_needed_released": bool,
//	 "record": bool (Config.Record; "heuristic": "auto" implies it)}
//
// Every key is optional; an empty input or "{}" gives base. An unknown key,
// a value of the wrong type or out of range is an error naming the key, the
// value and what is accepted.
func DecodeConfig(data []byte, base Config) (Config, UsageSource, error) {
	cfg, src := base, UsageSource{}
	if len(bytes.TrimSpace(data)) == 0 {
		return cfg, src, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return cfg, src, fmt.Errorf("dtr config: not a JSON object: %w", err)
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := raw[k]
		var err error
		switch k {
		case "budget":
			cfg.Budget, err = jsonBytes(k, v)
		case "evictee_min_size":
			cfg.EvicteeMinSize, err = jsonBytes(k, v)
		case "recomp_time_factor":
			cfg.RecompTimeFactor, err = jsonFloat(k, v)
		case "recomp_memory_factor":
			cfg.RecompMemoryFactor, err = jsonFloat(k, v)
		case "swap_bandwidth":
			cfg.SwapBandwidth, err = jsonFloat(k, v)
		case "heuristic":
			var s string
			if err = json.Unmarshal(v, &s); err != nil {
				err = fmt.Errorf("dtr config: heuristic %s: want a string", v)
				break
			}
			if cfg.Heuristic, err = ParseHeuristic(s); err != nil {
				err = fmt.Errorf("dtr config: %w", err)
			}
		case "usage":
			var s string
			if json.Unmarshal(v, &s) != nil || (s != "engine" && s != "allocator") {
				err = fmt.Errorf(`dtr config: usage %s: accepted "engine" (sum of resident registered bytes) or "allocator" (the allocator's allocated bytes)`, v)
				break
			}
			src.Allocator = s == "allocator"
		case "device":
			var d int
			if json.Unmarshal(v, &d) != nil || d < 0 {
				err = fmt.Errorf("dtr config: device %s: want a device ordinal >= 0", v)
				break
			}
			src.Device = d
		case "simulator_compat":
			if json.Unmarshal(v, &cfg.SimulatorCompat) != nil {
				err = fmt.Errorf("dtr config: simulator_compat %s: want true or false", v)
			}
		case "keep_needed_released":
			var keep bool
			if json.Unmarshal(v, &keep) != nil {
				err = fmt.Errorf("dtr config: keep_needed_released %s: want true or false", v)
			}
			cfg.DropNeededReleased = !keep
		case "record":
			if json.Unmarshal(v, &cfg.Record) != nil {
				err = fmt.Errorf("dtr config: record %s: want true or false", v)
			}
		default:
			err = fmt.Errorf("dtr config: unknown key %q (accepted: %s)", k, strings.Join(configKeys, ", "))
		}
		if err != nil {
			return base, UsageSource{}, err
		}
	}
	if err := cfg.validate(); err != nil {
		return base, UsageSource{}, err
	}
	return cfg, src, nil
}

// jsonBytes reads a non-negative integer byte count.
func jsonBytes(key string, v json.RawMessage) (uint64, error) {
	var n json.Number
	if err := json.Unmarshal(v, &n); err != nil {
		return 0, fmt.Errorf("dtr config: %s %s: want a number of bytes >= 0", key, v)
	}
	if u, err := n.Int64(); err == nil && u >= 0 {
		return uint64(u), nil
	}
	f, err := n.Float64()
	if err != nil || f < 0 || f != math.Trunc(f) || f > math.MaxInt64 {
		return 0, fmt.Errorf("dtr config: %s %s: want a whole number of bytes >= 0", key, v)
	}
	return uint64(f), nil
}

// jsonFloat reads a finite non-negative number.
func jsonFloat(key string, v json.RawMessage) (float64, error) {
	var f float64
	if err := json.Unmarshal(v, &f); err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("dtr config: %s %s: want a finite number >= 0", key, v)
	}
	return f, nil
}
