// Package config reads the MEMSCALE_* environment variables into a typed
// Config. Parsing is strict: a malformed value is an error that names the
// variable, the value and what is accepted; nothing falls back to a default
// silently. An unset or empty variable takes the documented default.
//
// The environment is read through an injectable lookup function, so the
// package holds no global state and tests can feed it any environment.
package config

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/memscale/memscale/allocator"
	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/logging"
)

// Names of the environment variables this package reads.
const (
	EnvBackend            = "MEMSCALE_BACKEND"
	EnvMemoryLimit        = "MEMSCALE_MEMORY_LIMIT"
	EnvEvictionThreshold  = "MEMSCALE_EVICTION_THRESHOLD"
	EnvEvicteeMinSize     = "MEMSCALE_EVICTEE_MIN_SIZE"
	EnvHeuristic          = "MEMSCALE_HEURISTIC"
	EnvRecompTimeFactor   = "MEMSCALE_RECOMP_TIME_FACTOR"
	EnvRecompMemoryFactor = "MEMSCALE_RECOMP_MEMORY_FACTOR"
	EnvSimCapacity        = "MEMSCALE_SIM_CAPACITY"
	EnvTraceCapacity      = "MEMSCALE_TRACE_CAPACITY"
	EnvLogLevel           = "MEMSCALE_LOG_LEVEL"
	EnvLogFormat          = "MEMSCALE_LOG_FORMAT"
	EnvBudgetSlack        = "MEMSCALE_BUDGET_SLACK"
	// EnvOpBatch and EnvNoExtension are read by the Python plugin; the
	// library checks them too, so that a malformed value is rejected with
	// the rest of the configuration (memscale_config_error) instead of
	// being read as something else.
	EnvOpBatch     = "MEMSCALE_OP_BATCH"
	EnvNoExtension = "MEMSCALE_NO_EXTENSION"
	// EnvNative chooses the DTR region's per-op path: 1 the native (C++)
	// region, 0 the Python one, unset the native one when it builds.
	EnvNative = "MEMSCALE_NATIVE"
)

// otherKnownVars are MEMSCALE_* variables read by other parts of memscale
// (the Python plugin, the test helpers); Unknown does not report them.
var otherKnownVars = []string{
	"MEMSCALE_LIBRARY",
	"MEMSCALE_DTR_TRACES",
	"MEMSCALE_CACHE_DIR", // where the plugin keeps its C extension
	// bench/gpu's scripts (bench/gpu/README.md)
	"MEMSCALE_GPU_BUDGET_S",
	"MEMSCALE_GPU_WORK",
	"MEMSCALE_GPU_FAKECUDA",
	"MEMSCALE_GPU_SKIP",
}

// Backend selects the device implementation.
type Backend string

// Accepted backends.
const (
	// BackendAuto uses CUDA when a driver and a device are present, else sim.
	BackendAuto Backend = "auto"
	// BackendCUDA requires the CUDA driver.
	BackendCUDA Backend = "cuda"
	// BackendSim emulates a card in host memory.
	BackendSim Backend = "sim"
)

// Backends lists the accepted MEMSCALE_BACKEND values.
var Backends = []Backend{BackendAuto, BackendCUDA, BackendSim}

// Heuristic names the DTR eviction heuristic: the configuration name of an
// evict.Heuristic. The engine owns the list of heuristics; this package
// validates against it (evict.ParseHeuristic), so a heuristic the engine
// accepts is never rejected here.
type Heuristic string

// HeuristicDefault lets the engine pick its default heuristic
// (evict.DefaultHeuristic). It is evict.Default's name.
const HeuristicDefault Heuristic = "default"

// HeuristicAuto is the tuning policy (evict.Auto): score with the default
// heuristic, record the step, and let package autotune choose the
// configuration of the steps that follow.
const HeuristicAuto Heuristic = "auto"

// Heuristics lists the accepted MEMSCALE_HEURISTIC values: every heuristic
// of the engine (evict.Heuristics), then HeuristicAuto and HeuristicDefault.
func Heuristics() []Heuristic {
	hs := evict.Heuristics()
	out := make([]Heuristic, 0, len(hs)+2)
	for _, h := range hs {
		out = append(out, Heuristic(h.String()))
	}
	return append(out, HeuristicAuto, HeuristicDefault)
}

// LogLevels lists the accepted MEMSCALE_LOG_LEVEL values (those of
// internal/logging).
var LogLevels = []string{"debug", "info", "warn", "error"}

// LogFormats lists the accepted MEMSCALE_LOG_FORMAT values (those of
// internal/logging).
var LogFormats = []string{"console", "json"}

// DefaultSimCapacity is the simulated card size when MEMSCALE_SIM_CAPACITY is
// unset: 16 GiB.
const DefaultSimCapacity uint64 = 16 << 30

// DefaultOpBatch is MEMSCALE_OP_BATCH's default: ops a DTR region registers
// per engine call.
const DefaultOpBatch = 32

// MaxOpBatch bounds MEMSCALE_OP_BATCH: a batch is a buffer of that many ops'
// frames, and more than this many ops per call saves nothing measurable.
const MaxOpBatch = 1 << 16

// MaxTraceCapacity bounds MEMSCALE_TRACE_CAPACITY (events kept in the
// allocator's trace ring).
const MaxTraceCapacity = 1 << 26

// MaxBudgetSlack bounds MEMSCALE_BUDGET_SLACK: a cache of 11 times the DTR
// budget is no longer a bound worth the name (the memory limit applies on
// top in any case).
const MaxBudgetSlack = 10

// Config is the effective memscale configuration.
type Config struct {
	// Backend is MEMSCALE_BACKEND (default auto).
	Backend Backend `json:"backend"`
	// MemoryLimit is MEMSCALE_MEMORY_LIMIT, the hard cap on reserved memory;
	// zero means the device capacity.
	MemoryLimit Size `json:"memory_limit"`
	// EvictionThreshold is MEMSCALE_EVICTION_THRESHOLD, the DTR budget; zero
	// means no eviction.
	EvictionThreshold Size `json:"eviction_threshold"`
	// EvicteeMinSize is MEMSCALE_EVICTEE_MIN_SIZE in bytes: smaller tensors
	// are never evicted. Default 0 (every tensor is a candidate).
	EvicteeMinSize uint64 `json:"evictee_min_size"`
	// Heuristic is MEMSCALE_HEURISTIC (default "default"), as the engine's
	// name for it: evict.ParseHeuristic's spellings are accepted
	// ("DTR_EQ" is stored as "dtr-eq").
	Heuristic Heuristic `json:"heuristic"`
	// RecompTimeFactor is MEMSCALE_RECOMP_TIME_FACTOR, the exponent of the
	// recompute cost in the score (default 1).
	RecompTimeFactor float64 `json:"recomp_time_factor"`
	// RecompMemoryFactor is MEMSCALE_RECOMP_MEMORY_FACTOR, the exponent of the
	// size in the score (default 1).
	RecompMemoryFactor float64 `json:"recomp_memory_factor"`
	// SimCapacity is MEMSCALE_SIM_CAPACITY, the simulated card size in bytes
	// (default 16 GiB).
	SimCapacity uint64 `json:"sim_capacity"`
	// TraceCapacity is MEMSCALE_TRACE_CAPACITY, the number of alloc/free
	// events kept for snapshots; 0 (default) disables the trace.
	TraceCapacity int `json:"trace_capacity"`
	// LogLevel is MEMSCALE_LOG_LEVEL (default logging.DefaultLevel, "warn"),
	// lower-cased.
	LogLevel string `json:"log_level"`
	// LogFormat is MEMSCALE_LOG_FORMAT (default logging.DefaultFormat,
	// "console"), lower-cased.
	LogFormat string `json:"log_format"`
	// OpBatch is MEMSCALE_OP_BATCH, the ops a DTR region registers per
	// engine call (default DefaultOpBatch; 1 to MaxOpBatch). The plugin
	// reads it; the library only checks it.
	OpBatch int `json:"op_batch"`
	// NoExtension is MEMSCALE_NO_EXTENSION: "1" asks the plugin to call the
	// engine through ctypes instead of its C extension; "0" or unset: not.
	NoExtension bool `json:"no_extension"`
	// BudgetSlack is MEMSCALE_BUDGET_SLACK, the allocator's
	// Config.BudgetSlack: while a DTR budget is known, the cache keeps up to
	// the budget plus BudgetSlack x the budget mapped before it remaps cached
	// granules (docs/allocator-budget.md). Default
	// allocator.DefaultBudgetSlack (0.10); "0" also selects the default;
	// negative: the budget is ignored (the bound is the allocated high-water
	// mark's).
	BudgetSlack float64 `json:"budget_slack"`
}

// Default returns the configuration used when no MEMSCALE_* variable is set.
func Default() Config {
	return Config{
		Backend:            BackendAuto,
		Heuristic:          HeuristicDefault,
		RecompTimeFactor:   1,
		RecompMemoryFactor: 1,
		SimCapacity:        DefaultSimCapacity,
		LogLevel:           logging.DefaultLevel,
		LogFormat:          logging.DefaultFormat,
		OpBatch:            DefaultOpBatch,
		BudgetSlack:        allocator.DefaultBudgetSlack,
	}
}

// ErrInvalid is wrapped by every error Load returns.
var ErrInvalid = errors.New("invalid memscale configuration")

// VarError reports a malformed environment variable.
type VarError struct {
	// Name is the variable, e.g. MEMSCALE_EVICTION_THRESHOLD.
	Name string
	// Value is the value as found in the environment.
	Value string
	// Accepted describes the accepted values.
	Accepted string
	// Err is the parse failure, when there is one more specific than "not
	// accepted".
	Err error
}

func (e *VarError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s=%q: %v; accepted: %s", e.Name, e.Value, e.Err, e.Accepted)
	}
	return fmt.Sprintf("%s=%q is not accepted; accepted: %s", e.Name, e.Value, e.Accepted)
}

// Unwrap returns the parse failure and ErrInvalid.
func (e *VarError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrInvalid, e.Err}
	}
	return []error{ErrInvalid}
}

// LookupFunc reads one environment variable; os.LookupEnv has this type.
type LookupFunc func(name string) (value string, ok bool)

// FromEnv loads the configuration from the process environment.
func FromEnv() (Config, error) { return Load(os.LookupEnv) }

// Load reads every MEMSCALE_* variable through lookup. Unset or empty
// (all-blank) variables keep their defaults. Every malformed variable is
// reported; the returned error joins one *VarError per bad variable. On error
// the returned Config holds the defaults for the bad variables and the parsed
// values for the others.
func Load(lookup LookupFunc) (Config, error) {
	if lookup == nil {
		return Config{}, fmt.Errorf("%w: config.Load: nil lookup function", ErrInvalid)
	}
	c := Default()
	l := loader{lookup: lookup}

	choice(&l, EnvBackend, Backends, func(v Backend) { c.Backend = v })
	l.sizeOrPercent(EnvMemoryLimit, &c.MemoryLimit)
	l.sizeOrPercent(EnvEvictionThreshold, &c.EvictionThreshold)
	l.size(EnvEvicteeMinSize, false, &c.EvicteeMinSize)
	l.heuristic(EnvHeuristic, &c.Heuristic)
	l.factor(EnvRecompTimeFactor, &c.RecompTimeFactor)
	l.factor(EnvRecompMemoryFactor, &c.RecompMemoryFactor)
	l.size(EnvSimCapacity, true, &c.SimCapacity)
	l.count(EnvTraceCapacity, MaxTraceCapacity, &c.TraceCapacity)
	choice(&l, EnvLogLevel, LogLevels, func(v string) { c.LogLevel = v })
	choice(&l, EnvLogFormat, LogFormats, func(v string) { c.LogFormat = v })
	l.positive(EnvOpBatch, MaxOpBatch, "ops registered per engine call; 1: one call per op", &c.OpBatch)
	choice(&l, EnvNoExtension, []string{"1", "0"}, func(v string) { c.NoExtension = v == "1" })
	choice(&l, EnvNative, []string{"1", "0"}, func(v string) {})
	l.budgetSlack(EnvBudgetSlack, &c.BudgetSlack)

	if err := c.checkStatic(); err != nil {
		l.errs = append(l.errs, err)
	}
	return c, errors.Join(l.errs...)
}

// checkStatic checks relations between variables that do not need the device
// capacity: an absolute eviction threshold above an absolute memory limit
// could never take effect.
func (c Config) checkStatic() error {
	if c.MemoryLimit.IsPercent() || c.EvictionThreshold.IsPercent() ||
		c.MemoryLimit.IsZero() || c.EvictionThreshold.IsZero() {
		return nil
	}
	if c.EvictionThreshold.Bytes > c.MemoryLimit.Bytes {
		return fmt.Errorf("%w: %s=%d bytes is above %s=%d bytes: the threshold must not exceed the limit",
			ErrInvalid, EnvEvictionThreshold, c.EvictionThreshold.Bytes, EnvMemoryLimit, c.MemoryLimit.Bytes)
	}
	return nil
}

// Limits are the sizes of a Config resolved against one device.
type Limits struct {
	// MemoryLimit is the hard cap in bytes; 0 means the device capacity.
	MemoryLimit uint64 `json:"memory_limit"`
	// EvictionThreshold is the DTR budget in bytes; 0 means none.
	EvictionThreshold uint64 `json:"eviction_threshold"`
}

// Resolve turns the percentages of c into bytes for a device with total bytes
// of memory and checks that the limit and the threshold fit on the device
// and that the threshold does not exceed the limit.
func (c Config) Resolve(total uint64) (Limits, error) {
	lim := Limits{
		MemoryLimit:       c.MemoryLimit.Resolve(total),
		EvictionThreshold: c.EvictionThreshold.Resolve(total),
	}
	var errs []error
	if lim.MemoryLimit > total {
		errs = append(errs, fmt.Errorf("%w: %s=%s is %d bytes, more than the device's %d bytes",
			ErrInvalid, EnvMemoryLimit, c.MemoryLimit, lim.MemoryLimit, total))
	}
	if lim.EvictionThreshold > total {
		errs = append(errs, fmt.Errorf("%w: %s=%s is %d bytes, more than the device's %d bytes",
			ErrInvalid, EnvEvictionThreshold, c.EvictionThreshold, lim.EvictionThreshold, total))
	}
	if lim.MemoryLimit > 0 && lim.EvictionThreshold > lim.MemoryLimit {
		errs = append(errs, fmt.Errorf("%w: %s=%s (%d bytes) is above %s=%s (%d bytes) on a device of %d bytes",
			ErrInvalid, EnvEvictionThreshold, c.EvictionThreshold, lim.EvictionThreshold,
			EnvMemoryLimit, c.MemoryLimit, lim.MemoryLimit, total))
	}
	if len(errs) > 0 {
		return Limits{}, errors.Join(errs...)
	}
	return lim, nil
}

// Unknown returns the names of MEMSCALE_* variables in environ (os.Environ
// form, "NAME=value") that memscale does not read - usually typos. They are
// not errors; callers log them.
func Unknown(environ []string) []string {
	known := map[string]bool{}
	for _, n := range KnownVars() {
		known[n] = true
	}
	for _, n := range otherKnownVars {
		known[n] = true
	}
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "MEMSCALE_") && !known[name] {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// KnownVars lists the variables Load reads.
func KnownVars() []string {
	return []string{
		EnvBackend, EnvMemoryLimit, EnvEvictionThreshold, EnvEvicteeMinSize,
		EnvHeuristic, EnvRecompTimeFactor, EnvRecompMemoryFactor, EnvSimCapacity,
		EnvTraceCapacity, EnvLogLevel, EnvLogFormat, EnvOpBatch, EnvNoExtension,
		EnvBudgetSlack, EnvNative,
	}
}

// loader collects the per-variable errors of one Load.
type loader struct {
	lookup LookupFunc
	errs   []error
}

// get returns the trimmed value of name and whether it is set and non-blank,
// plus the raw value for error messages.
func (l *loader) get(name string) (value, raw string, ok bool) {
	raw, ok = l.lookup(name)
	if !ok {
		return "", "", false
	}
	value = strings.TrimSpace(raw)
	return value, raw, value != ""
}

func (l *loader) fail(name, raw, accepted string, err error) {
	l.errs = append(l.errs, &VarError{Name: name, Value: raw, Accepted: accepted, Err: err})
}

func (l *loader) sizeOrPercent(name string, dst *Size) {
	v, raw, ok := l.get(name)
	if !ok {
		return
	}
	s, err := ParseSizeOrPercent(v)
	if err != nil {
		l.fail(name, raw, SizeSyntax+"; or "+PercentSyntax, err)
		return
	}
	*dst = s
}

func (l *loader) size(name string, positive bool, dst *uint64) {
	v, raw, ok := l.get(name)
	if !ok {
		return
	}
	accepted := SizeSyntax
	if positive {
		accepted = "a size greater than 0: " + SizeSyntax
	}
	n, err := ParseSize(v)
	if err != nil {
		l.fail(name, raw, accepted, err)
		return
	}
	if positive && n == 0 {
		l.fail(name, raw, accepted, errors.New("must be greater than 0"))
		return
	}
	*dst = n
}

func (l *loader) factor(name string, dst *float64) {
	v, raw, ok := l.get(name)
	if !ok {
		return
	}
	accepted := fmt.Sprintf(`a decimal number greater than 0 and at most %d ("1", "0.5", "2.25")`, evict.MaxRecompFactor)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || strings.ContainsAny(v, "xX_") {
		l.fail(name, raw, accepted, errors.New("not a number"))
		return
	}
	if math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 {
		l.fail(name, raw, accepted, errors.New("not a finite number greater than 0"))
		return
	}
	if f > evict.MaxRecompFactor {
		l.fail(name, raw, accepted, fmt.Errorf("above %d: the exponent would overflow the eviction score (cost^%v)", evict.MaxRecompFactor, f))
		return
	}
	*dst = f
}

// budgetSlack accepts a finite decimal number up to MaxBudgetSlack: the
// share of the DTR budget the allocator's cache may hold beyond it; 0 is the
// default (allocator.DefaultBudgetSlack), a negative number ignores the
// budget.
func (l *loader) budgetSlack(name string, dst *float64) {
	v, raw, ok := l.get(name)
	if !ok {
		return
	}
	accepted := fmt.Sprintf(`a decimal number at most %d: the share of the DTR budget the cache may hold beyond it `+
		`("0.1" = 10 %%; "0" = the default %v; negative, e.g. "-1" = ignore the budget)`, MaxBudgetSlack, allocator.DefaultBudgetSlack)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || strings.ContainsAny(v, "xX_") {
		l.fail(name, raw, accepted, errors.New("not a number"))
		return
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		l.fail(name, raw, accepted, errors.New("not a finite number"))
		return
	}
	if f > MaxBudgetSlack {
		l.fail(name, raw, accepted, fmt.Errorf("above %d", MaxBudgetSlack))
		return
	}
	switch {
	case f == 0:
		f = allocator.DefaultBudgetSlack
	case f < 0:
		f = -1
	}
	*dst = f
}

// positive accepts a whole number from 1 to limit; what says what it counts.
func (l *loader) positive(name string, limit int, what string, dst *int) {
	v, raw, ok := l.get(name)
	if !ok {
		return
	}
	accepted := fmt.Sprintf("a whole number from 1 to %d (%s)", limit, what)
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			l.fail(name, raw, accepted, errors.New("too large"))
			return
		}
		l.fail(name, raw, accepted, errors.New("not a whole number"))
		return
	}
	if n < 1 || n > uint64(limit) {
		l.fail(name, raw, accepted, errors.New("out of range"))
		return
	}
	*dst = int(n)
}

func (l *loader) count(name string, limit int, dst *int) {
	v, raw, ok := l.get(name)
	if !ok {
		return
	}
	accepted := fmt.Sprintf("a whole number of events from 0 (off) to %d", limit)
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		l.fail(name, raw, accepted, errors.New("not a whole number"))
		return
	}
	if n > uint64(limit) {
		l.fail(name, raw, accepted, errors.New("too large"))
		return
	}
	*dst = int(n)
}

// heuristic accepts what the engine accepts (evict.ParseHeuristic: any
// letter case, "_" for "-") and stores the heuristic's canonical name.
func (l *loader) heuristic(name string, dst *Heuristic) {
	v, raw, ok := l.get(name)
	if !ok {
		return
	}
	h, err := evict.ParseHeuristic(v)
	if err != nil {
		accepted := Heuristics()
		names := make([]string, len(accepted))
		for i, a := range accepted {
			names[i] = string(a)
		}
		// ParseHeuristic's error repeats the list: Accepted says it once.
		l.fail(name, raw, "one of "+strings.Join(names, ", "), nil)
		return
	}
	*dst = Heuristic(h.String())
}

// choice accepts one of the listed values, case-insensitively.
func choice[T ~string](l *loader, name string, accepted []T, set func(T)) {
	v, raw, ok := l.get(name)
	if !ok {
		return
	}
	lv := strings.ToLower(v)
	names := make([]string, len(accepted))
	for i, a := range accepted {
		if string(a) == lv {
			set(a)
			return
		}
		names[i] = string(a)
	}
	l.fail(name, raw, "one of "+strings.Join(names, ", "), nil)
}
