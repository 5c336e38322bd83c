// The JSON form of a Config: the configuration of memscale_dtr_create
// (Defaults.Decode) and the configuration an engine runs with (Config.JSON).
// See doc.go for the design.

package evict

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
)

// configKeys are the keys DecodeConfig accepts.
var configKeys = []string{
	"budget", "heuristic", "recomp_time_factor", "recomp_memory_factor",
	"evictee_min_size", "swap_bandwidth", "park", "offload_limit", "usage", "device", "simulator_compat",
	"keep_needed_released", "record", "stress", "defaults",
}

// DecodeConfig is Defaults{Config: base}.Decode(data): base holds the
// defaults, none of them set by the environment.
func DecodeConfig(data []byte, base Config) (Config, UsageSource, error) {
	return Defaults{Config: base}.Decode(data)
}

// Decode parses the JSON configuration of memscale_dtr_create on top of
// d.Config:
//
//	{"budget": bytes (0 = unlimited), "heuristic": name (see ParseHeuristic),
//	 "recomp_time_factor": f, "recomp_memory_factor": f,
//	 "evictee_min_size": bytes, "swap_bandwidth": bytes/s (0 = never swap),
//	 "park": bool (Config.Park),
//	 "offload_limit": bytes swapped out at most (0 = no cap),
//	 "usage": "engine" | "allocator", "device": ordinal (for "allocator"),
//	 "simulator_compat": bool, "keep_needed_released": bool,
//	 "record": bool (Config.Record; "heuristic": "auto" implies it),
//	 "stress": bool (Config.Stress), "defaults": "region",
//	 "reserve": {"ops": n, "tensors": n, "storages": n} (Config.Reserve)}
//
// Every key is optional; an empty input or "{}" gives d.Config. With
// "defaults": "region" the settings the caller did not give take the DTR
// region's defaults instead of d.Config's, except where the environment set
// them (see Defaults): evictee_min_size RegionEvicteeMinSize (0 with
// "stress": true), and heuristic "auto" when the budget is > 0 and stress is
// off ("default" otherwise). An unknown key,
// a value of the wrong type or out of range is an error naming the key, the
// value and what is accepted.
func (d Defaults) Decode(data []byte) (Config, UsageSource, error) {
	base := d.Config
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
	region := false
	for _, k := range keys {
		v := raw[k]
		var err error
		switch k {
		case "budget":
			cfg.Budget, err = jsonBytes(k, v)
		case "evictee_min_size":
			cfg.EvicteeMinSize, err = jsonBytes(k, v)
		case "offload_limit":
			cfg.OffloadLimit, err = jsonBytes(k, v)
		case "recomp_time_factor":
			cfg.RecompTimeFactor, err = jsonFloat(k, v)
		case "recomp_memory_factor":
			cfg.RecompMemoryFactor, err = jsonFloat(k, v)
		case "swap_bandwidth":
			cfg.SwapBandwidth, err = jsonFloat(k, v)
		case "park":
			if json.Unmarshal(v, &cfg.Park) != nil {
				err = fmt.Errorf("dtr config: park %s: want true or false", v)
			}
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
		case "reserve":
			dec := json.NewDecoder(bytes.NewReader(v))
			dec.DisallowUnknownFields()
			if dec.Decode(&cfg.Reserve) != nil {
				err = fmt.Errorf(`dtr config: reserve %s: want {"ops": n, "tensors": n, "storages": n}`, v)
			}
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
		case "stress":
			if json.Unmarshal(v, &cfg.Stress) != nil {
				err = fmt.Errorf("dtr config: stress %s: want true or false", v)
			}
		case "defaults":
			var s string
			if json.Unmarshal(v, &s) != nil || s != "region" {
				err = fmt.Errorf(`dtr config: defaults %s: accepted "region" (the DTR region's defaults for the keys not given)`, v)
			}
			region = true
		default:
			err = fmt.Errorf("dtr config: unknown key %q (accepted: %s)", k, strings.Join(configKeys, ", "))
		}
		if err != nil {
			return base, UsageSource{}, err
		}
	}
	if region {
		cfg = d.regionDefaults(cfg, func(k string) bool { _, ok := raw[k]; return ok })
	}
	if err := cfg.validate(); err != nil {
		return base, UsageSource{}, err
	}
	return cfg, src, nil
}

// JSON returns the configuration as the keys Decode accepts, to be
// reported or merged into another engine's configuration: "budget",
// "heuristic" (the name as configured: "auto" for the tuning policy),
// "recomp_time_factor" and "recomp_memory_factor" (omitted when 0, which
// means 1), "evictee_min_size", "swap_bandwidth" (omitted when 0), "park",
// "usage" ("engine" or "allocator", from src), "device" (with "allocator"
// only), "simulator_compat", "keep_needed_released", "record", "stress"
// and "reserve" (omitted when zero). Given
// keys, only those of them it has. Decoding the result on top of defaults
// with zero exponents and bandwidth gives back c and src, less what JSON
// cannot carry (Usage, OnEvict, ExactScan).
func (c Config) JSON(src UsageSource, keys ...string) map[string]any {
	all := map[string]any{
		"budget":               c.Budget,
		"heuristic":            c.Heuristic.String(),
		"evictee_min_size":     c.EvicteeMinSize,
		"offload_limit":        c.OffloadLimit,
		"usage":                "engine",
		"simulator_compat":     c.SimulatorCompat,
		"keep_needed_released": !c.DropNeededReleased,
		"record":               c.Record,
		"stress":               c.Stress,
		"park":                 c.Park,
	}
	for k, f := range map[string]float64{"recomp_time_factor": c.RecompTimeFactor,
		"recomp_memory_factor": c.RecompMemoryFactor, "swap_bandwidth": c.SwapBandwidth} {
		if f != 0 {
			all[k] = f
		}
	}
	if src.Allocator {
		all["usage"], all["device"] = "allocator", src.Device
	}
	if c.Reserve != (GraphSize{}) {
		all["reserve"] = c.Reserve
	}
	if len(keys) == 0 {
		return all
	}
	out := make(map[string]any, len(keys))
	for _, k := range keys {
		if v, ok := all[k]; ok {
			out[k] = v
		}
	}
	return out
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
