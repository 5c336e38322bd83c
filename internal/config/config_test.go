package config

import (
	"errors"
	"io"
	"testing"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/logging"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// env returns a LookupFunc over a fixed map.
func env(m map[string]string) LookupFunc {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

func TestLoadDefaults(t *testing.T) {
	c, err := Load(env(nil))
	require.NoError(t, err)
	assert.Equal(t, Default(), c)
	assert.Equal(t, BackendAuto, c.Backend)
	assert.Equal(t, HeuristicDefault, c.Heuristic)
	assert.Equal(t, DefaultSimCapacity, c.SimCapacity)
	assert.Equal(t, 1.0, c.RecompTimeFactor)
	assert.Equal(t, 1.0, c.RecompMemoryFactor)
	assert.True(t, c.MemoryLimit.IsZero())
	assert.True(t, c.EvictionThreshold.IsZero())
}

func TestLoadEmptyIsUnset(t *testing.T) {
	m := map[string]string{}
	for _, n := range KnownVars() {
		m[n] = "  "
	}
	c, err := Load(env(m))
	require.NoError(t, err)
	assert.Equal(t, Default(), c)
}

func TestLoadValues(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		check func(t *testing.T, c Config)
	}{
		{"backend sim", map[string]string{EnvBackend: "sim"}, func(t *testing.T, c Config) {
			assert.Equal(t, BackendSim, c.Backend)
		}},
		{"backend upper case", map[string]string{EnvBackend: " CUDA "}, func(t *testing.T, c Config) {
			assert.Equal(t, BackendCUDA, c.Backend)
		}},
		{"limit bytes", map[string]string{EnvMemoryLimit: "12GiB"}, func(t *testing.T, c Config) {
			assert.Equal(t, Size{Bytes: 12 << 30}, c.MemoryLimit)
		}},
		{"threshold percent", map[string]string{EnvEvictionThreshold: "75%"}, func(t *testing.T, c Config) {
			assert.Equal(t, Size{Percent: 75}, c.EvictionThreshold)
		}},
		{"threshold decimal GB", map[string]string{"MEMSCALE_EVICTION_THRESHOLD": "1.5GB"}, func(t *testing.T, c Config) {
			assert.Equal(t, Size{Bytes: 1_500_000_000}, c.EvictionThreshold)
		}},
		{"threshold below limit", map[string]string{EnvEvictionThreshold: "1GiB", EnvMemoryLimit: "2GiB"},
			func(t *testing.T, c Config) {
				assert.Equal(t, uint64(1<<30), c.EvictionThreshold.Bytes)
				assert.Equal(t, uint64(2<<30), c.MemoryLimit.Bytes)
			}},
		{"evictee min size", map[string]string{EnvEvicteeMinSize: "1MB"}, func(t *testing.T, c Config) {
			assert.Equal(t, uint64(1e6), c.EvicteeMinSize)
		}},
		{"heuristic", map[string]string{EnvHeuristic: "dtr-eq"}, func(t *testing.T, c Config) {
			assert.Equal(t, Heuristic("dtr-eq"), c.Heuristic)
		}},
		{"heuristic anc-sqrt", map[string]string{EnvHeuristic: "anc-sqrt"}, func(t *testing.T, c Config) {
			assert.Equal(t, Heuristic("anc-sqrt"), c.Heuristic)
		}},
		{"heuristic dtr-eq-anc", map[string]string{EnvHeuristic: "dtr-eq-anc"}, func(t *testing.T, c Config) {
			assert.Equal(t, Heuristic("dtr-eq-anc"), c.Heuristic)
		}},
		{"heuristic engine spelling", map[string]string{EnvHeuristic: " DTR_Eq_Anc "}, func(t *testing.T, c Config) {
			assert.Equal(t, Heuristic("dtr-eq-anc"), c.Heuristic, "stored as the engine's canonical name")
		}},
		{"heuristic default", map[string]string{EnvHeuristic: "Default"}, func(t *testing.T, c Config) {
			assert.Equal(t, HeuristicDefault, c.Heuristic)
		}},
		{"factors", map[string]string{EnvRecompTimeFactor: "0.5", EnvRecompMemoryFactor: "2e0"},
			func(t *testing.T, c Config) {
				assert.Equal(t, 0.5, c.RecompTimeFactor)
				assert.Equal(t, 2.0, c.RecompMemoryFactor)
			}},
		{"sim capacity", map[string]string{EnvSimCapacity: "4GiB"}, func(t *testing.T, c Config) {
			assert.Equal(t, uint64(4<<30), c.SimCapacity)
		}},
		{"trace capacity", map[string]string{EnvTraceCapacity: "10000"}, func(t *testing.T, c Config) {
			assert.Equal(t, 10000, c.TraceCapacity)
		}},
		{"logging", map[string]string{EnvLogLevel: "debug", EnvLogFormat: "JSON"}, func(t *testing.T, c Config) {
			assert.Equal(t, "debug", c.LogLevel)
			assert.Equal(t, "json", c.LogFormat)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(env(tt.env))
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name, variable, value string
		wantMsg               []string
	}{
		{"threshold banana", EnvEvictionThreshold, "banana",
			[]string{`MEMSCALE_EVICTION_THRESHOLD="banana"`, "KiB", "75%"}},
		{"threshold negative", EnvEvictionThreshold, "-1GiB", []string{"negative"}},
		{"threshold over 100%", EnvEvictionThreshold, "120%", []string{"outside"}},
		{"limit unit", EnvMemoryLimit, "12G", []string{`MEMSCALE_MEMORY_LIMIT="12G"`, `unknown unit "G"`}},
		{"backend", EnvBackend, "rocm", []string{`MEMSCALE_BACKEND="rocm"`, "auto, cuda, sim"}},
		{"heuristic", EnvHeuristic, "random",
			[]string{`MEMSCALE_HEURISTIC="random"`, "dtr, dtr-eq, dtr-local, msps, lru, size, dtr-eq-anc, anc-sqrt, auto, default"}},
		{"heuristic with a space", EnvHeuristic, "dtr eq", []string{`MEMSCALE_HEURISTIC="dtr eq"`, "anc-sqrt"}},
		{"evictee percent", EnvEvicteeMinSize, "5%", []string{"MEMSCALE_EVICTEE_MIN_SIZE", "percentage"}},
		{"time factor zero", EnvRecompTimeFactor, "0", []string{"MEMSCALE_RECOMP_TIME_FACTOR", "greater than 0"}},
		{"time factor negative", EnvRecompTimeFactor, "-1", []string{"greater than 0"}},
		{"time factor nan", EnvRecompTimeFactor, "NaN", []string{"finite"}},
		{"time factor inf", EnvRecompTimeFactor, "+Inf", []string{"finite"}},
		{"memory factor text", EnvRecompMemoryFactor, "one", []string{"MEMSCALE_RECOMP_MEMORY_FACTOR", "not a number"}},
		{"memory factor hex", EnvRecompMemoryFactor, "0x10", []string{"not a number"}},
		{"sim capacity zero", EnvSimCapacity, "0", []string{"MEMSCALE_SIM_CAPACITY", "greater than 0"}},
		{"sim capacity percent", EnvSimCapacity, "50%", []string{"percentage"}},
		{"trace capacity negative", EnvTraceCapacity, "-5", []string{"MEMSCALE_TRACE_CAPACITY", "whole number"}},
		{"trace capacity huge", EnvTraceCapacity, "99999999999", []string{"too large"}},
		{"trace capacity decimal", EnvTraceCapacity, "1.5", []string{"whole number"}},
		{"log level", EnvLogLevel, "verbose", []string{`MEMSCALE_LOG_LEVEL="verbose"`, "debug, info, warn, error"}},
		{"log format", EnvLogFormat, "xml", []string{`MEMSCALE_LOG_FORMAT="xml"`, "console, json"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(env(map[string]string{tt.variable: tt.value}))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalid)
			var ve *VarError
			require.True(t, errors.As(err, &ve))
			assert.Equal(t, tt.variable, ve.Name)
			assert.Equal(t, tt.value, ve.Value)
			assert.NotEmpty(t, ve.Accepted)
			for _, m := range tt.wantMsg {
				assert.Contains(t, err.Error(), m)
			}
			// The bad variable keeps its default; nothing else changes.
			assert.Equal(t, Default(), c)
		})
	}
}

func TestLoadReportsEveryBadVariable(t *testing.T) {
	_, err := Load(env(map[string]string{
		EnvBackend:           "x",
		EnvEvictionThreshold: "y",
		EnvTraceCapacity:     "z",
	}))
	require.Error(t, err)
	for _, n := range []string{EnvBackend, EnvEvictionThreshold, EnvTraceCapacity} {
		assert.Contains(t, err.Error(), n)
	}
}

func TestLoadThresholdAboveLimit(t *testing.T) {
	_, err := Load(env(map[string]string{EnvEvictionThreshold: "3GiB", EnvMemoryLimit: "2GiB"}))
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), EnvEvictionThreshold)
	assert.Contains(t, err.Error(), EnvMemoryLimit)
}

func TestLoadNilLookup(t *testing.T) {
	_, err := Load(nil)
	require.ErrorIs(t, err, ErrInvalid)
}

func TestResolve(t *testing.T) {
	const total = 16 << 30
	tests := []struct {
		name    string
		limit   Size
		thresh  Size
		want    Limits
		wantErr []string
	}{
		{"unset", Size{}, Size{}, Limits{}, nil},
		{"percent threshold", Size{}, Size{Percent: 75}, Limits{EvictionThreshold: 12 << 30}, nil},
		{"both percent", Size{Percent: 90}, Size{Percent: 50},
			Limits{MemoryLimit: total * 9 / 10, EvictionThreshold: 8 << 30}, nil},
		{"bytes", Size{Bytes: 8 << 30}, Size{Bytes: 4 << 30}, Limits{MemoryLimit: 8 << 30, EvictionThreshold: 4 << 30}, nil},
		{"limit above device", Size{Bytes: 20 << 30}, Size{}, Limits{},
			[]string{EnvMemoryLimit, "more than the device"}},
		{"threshold above device", Size{}, Size{Bytes: 17 << 30}, Limits{},
			[]string{EnvEvictionThreshold, "more than the device"}},
		{"threshold above percent limit", Size{Percent: 50}, Size{Percent: 75}, Limits{},
			[]string{EnvEvictionThreshold, EnvMemoryLimit, "75%", "50%"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.MemoryLimit = tt.limit
			c.EvictionThreshold = tt.thresh
			got, err := c.Resolve(total)
			if tt.wantErr != nil {
				require.Error(t, err)
				assert.ErrorIs(t, err, ErrInvalid)
				for _, m := range tt.wantErr {
					assert.Contains(t, err.Error(), m)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestUnknown(t *testing.T) {
	got := Unknown([]string{
		"PATH=/bin",
		"MEMSCALE_EVICTION_THRESHOLD=1GiB",
		"MEMSCALE_EVICTION_THRESHHOLD=1GiB",
		"MEMSCALE_LIBRARY=/x.so",
		"MEMSCALE_BACKND=sim",
	})
	assert.Equal(t, []string{"MEMSCALE_BACKND", "MEMSCALE_EVICTION_THRESHHOLD"}, got)
}

// TestLogValuesMatchLogging keeps the accepted log levels and formats in step
// with internal/logging, which builds the logger from them.
func TestLogValuesMatchLogging(t *testing.T) {
	for _, l := range LogLevels {
		_, err := logging.ParseLevel(l)
		assert.NoError(t, err, l)
	}
	for _, f := range LogFormats {
		for _, l := range LogLevels {
			_, err := logging.NewTo(io.Discard, l, f)
			assert.NoError(t, err, "%s/%s", l, f)
		}
	}
	_, err := logging.ParseLevel(Default().LogLevel)
	assert.NoError(t, err)
}

// TestHeuristicsAreTheEngines checks that MEMSCALE_HEURISTIC accepts exactly
// what the engine accepts: every evict.Heuristic by name (stored so that
// evict.ParseHeuristic gives it back), "default" for evict.Default, and
// Heuristics lists them all.
func TestHeuristicsAreTheEngines(t *testing.T) {
	assert.Equal(t, evict.Default.String(), string(HeuristicDefault))
	want := []Heuristic{}
	for _, h := range evict.Heuristics() {
		want = append(want, Heuristic(h.String()))
	}
	assert.Equal(t, append(want, HeuristicAuto, HeuristicDefault), Heuristics())
	for _, h := range append(evict.Heuristics(), evict.Default) {
		t.Run(h.String(), func(t *testing.T) {
			c, err := Load(env(map[string]string{EnvHeuristic: h.String()}))
			require.NoError(t, err)
			assert.Equal(t, Heuristic(h.String()), c.Heuristic)
			back, err := evict.ParseHeuristic(string(c.Heuristic))
			require.NoError(t, err)
			assert.Equal(t, h, back)
		})
	}
	assert.Contains(t, Heuristics(), Heuristic("anc-sqrt"))
	assert.Contains(t, Heuristics(), Heuristic("dtr-eq-anc"))
}
