package evict

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecodeRegionDefaults(t *testing.T) {
	unset := Defaults{Config: Config{RecompTimeFactor: 2}}
	envHeuristic := func(h Heuristic) Defaults {
		return Defaults{Config: Config{Heuristic: h}, HeuristicSet: true}
	}
	envMinSize := Defaults{Config: Config{EvicteeMinSize: 4096}, EvicteeMinSizeSet: true}
	tests := []struct {
		name      string
		defaults  Defaults
		in        string
		heuristic Heuristic
		minSize   uint64
		err       string
	}{
		{"budget: auto", unset, `{"defaults": "region", "budget": 1000}`, Auto, RegionEvicteeMinSize, ""},
		{"no budget: default", unset, `{"defaults": "region"}`, Default, RegionEvicteeMinSize, ""},
		{"budget 0: default", unset, `{"defaults": "region", "budget": 0}`, Default, RegionEvicteeMinSize, ""},
		{"caller's heuristic", unset, `{"defaults": "region", "budget": 1000, "heuristic": "dtr"}`, DTR, RegionEvicteeMinSize, ""},
		{"caller's default heuristic", unset, `{"defaults": "region", "budget": 1000, "heuristic": "default"}`, Default, RegionEvicteeMinSize, ""},
		{"caller's minimum size", unset, `{"defaults": "region", "budget": 1000, "evictee_min_size": 0}`, Auto, 0, ""},
		{"environment's heuristic", envHeuristic(MSPS), `{"defaults": "region", "budget": 1000}`, MSPS, RegionEvicteeMinSize, ""},
		{"environment's default", envHeuristic(Default), `{"defaults": "region", "budget": 1000}`, Default, RegionEvicteeMinSize, ""},
		{"environment's auto", envHeuristic(Auto), `{"defaults": "region", "budget": 1000}`, Auto, RegionEvicteeMinSize, ""},
		{"environment's auto, no budget", envHeuristic(Auto), `{"defaults": "region"}`, Default, RegionEvicteeMinSize, ""},
		{"environment's heuristic, no budget", envHeuristic(LRU), `{"defaults": "region"}`, LRU, RegionEvicteeMinSize, ""},
		{"caller over environment", envHeuristic(LRU), `{"defaults": "region", "heuristic": "size"}`, Size, RegionEvicteeMinSize, ""},
		{"environment's minimum size", envMinSize, `{"defaults": "region", "budget": 1000}`, Auto, 4096, ""},
		{"engine defaults", unset, `{"budget": 1000}`, Default, 0, ""},
		{"engine defaults, environment", envHeuristic(Auto), `{"budget": 1000}`, Auto, 0, ""},
		{"unknown defaults", unset, `{"defaults": "engine"}`, 0, 0, `defaults "engine": accepted "region"`},
		{"defaults not a string", unset, `{"defaults": 1}`, 0, 0, `defaults 1: accepted "region"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := tc.defaults.Decode([]byte(tc.in))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				assert.Equal(t, tc.defaults.Config, cfg, "a failed decode returns the defaults")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.heuristic, cfg.Heuristic)
			assert.Equal(t, tc.minSize, cfg.EvicteeMinSize)
			assert.Equal(t, tc.defaults.Config.RecompTimeFactor, cfg.RecompTimeFactor, "other settings keep the defaults")
		})
	}
}

func TestConfigJSONRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		src  UsageSource
		want map[string]any // a subset of the keys, as JSON numbers
		omit []string
	}{
		{"zero", Config{}, UsageSource{},
			map[string]any{"budget": 0.0, "heuristic": "default", "evictee_min_size": 0.0, "usage": "engine",
				"keep_needed_released": true, "simulator_compat": false, "record": false, "stress": false},
			[]string{"recomp_time_factor", "recomp_memory_factor", "swap_bandwidth", "device"}},
		{"auto region", Config{Budget: 1 << 30, Heuristic: Auto, EvicteeMinSize: RegionEvicteeMinSize}, UsageSource{},
			map[string]any{"budget": float64(1 << 30), "heuristic": "auto", "evictee_min_size": 1024.0}, nil},
		{"everything", Config{Budget: 5, Heuristic: DTREq, RecompTimeFactor: 0.5, RecompMemoryFactor: 2,
			EvicteeMinSize: 7, SwapBandwidth: 1e10, SimulatorCompat: true, DropNeededReleased: true, Record: true, Stress: true},
			UsageSource{Allocator: true, Device: 3},
			map[string]any{"heuristic": "dtr-eq", "recomp_time_factor": 0.5, "recomp_memory_factor": 2.0,
				"swap_bandwidth": 1e10, "usage": "allocator", "device": 3.0, "keep_needed_released": false, "record": true,
				"stress": true}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			js, err := json.Marshal(tc.cfg.JSON(tc.src))
			require.NoError(t, err)
			var m map[string]any
			require.NoError(t, json.Unmarshal(js, &m))
			for k, v := range tc.want {
				assert.Equal(t, v, m[k], "%s in %s", k, js)
			}
			for _, k := range tc.omit {
				assert.NotContains(t, m, k)
			}
			back, src, err := Defaults{Config: Config{Heuristic: LRU, EvicteeMinSize: 99}}.Decode(js)
			require.NoError(t, err, "%s", js)
			assert.Equal(t, tc.cfg, back, "%s", js)
			assert.Equal(t, tc.src, src)
		})
	}
	sub := Config{Budget: 9, Heuristic: MSPS}.JSON(UsageSource{}, "heuristic", "swap_bandwidth", "budget")
	assert.Equal(t, map[string]any{"heuristic": "msps", "budget": uint64(9)}, sub, "only the keys asked for, if set")
}
