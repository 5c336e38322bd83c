package main

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/evict"
	rc "github.com/memscale/memscale/recompute"
)

// newTestEngine creates an engine from config through the export and
// destroys it when the test ends.
func newTestEngine(t *testing.T, config string) int64 {
	t.Helper()
	h := abiDTRCreate(config)
	require.Positive(t, h, lastError())
	t.Cleanup(func() { abiDTRDestroy(h) })
	return h
}

// dtrChain registers a pinned parameter of 100 bytes and n ops of size bytes
// each, x -> t1 -> ... -> tn, on engine h; it returns the outputs.
func dtrChain(t *testing.T, h int64, n int, size int64) []int64 {
	t.Helper()
	x := abiDTRTensor(h, 100, 1)
	require.GreaterOrEqual(t, x, int64(0), lastError())
	var outs []int64
	for i := 0; i < n; i++ {
		op, ids := abiDTRCall(h, []int64{x}, []int64{size}, []int32{-1}, 10*int64(i+1), 0)
		require.GreaterOrEqual(t, op, int64(0), lastError())
		x = ids[0]
		outs = append(outs, x)
	}
	return outs
}

// statsOf returns memscale_dtr_stats_json of h, decoded.
func statsOf(t *testing.T, h int64) map[string]any {
	t.Helper()
	js := abiDTRStatsJSON(h)
	require.NotEmpty(t, js, lastError())
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(js), &m))
	return m
}

// setEnv sets (or, for value nil, unsets) an environment variable - libc's
// too, this being a cgo program - for the rest of the test.
func setEnv(t *testing.T, name string, value *string) {
	t.Helper()
	old, had := os.LookupEnv(name)
	if value == nil {
		require.NoError(t, os.Unsetenv(name))
	} else {
		require.NoError(t, os.Setenv(name, *value))
	}
	t.Cleanup(func() {
		if had {
			_ = os.Setenv(name, old)
		} else {
			_ = os.Unsetenv(name)
		}
	})
}

func TestDTRStatusLayout(t *testing.T) {
	size, offsets := dtrStatusLayout()
	assert.Equal(t, uintptr(56), size, "seven int64_t fields, nothing else")
	assert.Equal(t, []uintptr{0, 8, 16, 24, 32, 40, 48}, offsets,
		"usage, budget, pending, bytes_evicted, peak_usage, next_op, next_tensor")
}

func TestDTRStatusTracksEveryCall(t *testing.T) {
	blocks := liveStatusBlocks.Load()
	h := abiDTRCreate(`{"budget": 1000, "heuristic": "lru"}`)
	require.Positive(t, h, lastError())
	p, st := abiDTRStatus(h)
	require.NotZero(t, p, lastError())
	assert.Equal(t, dtrStatus{Budget: 1000}, st, "written by create")
	assert.Equal(t, blocks+1, liveStatusBlocks.Load())

	ts := dtrChain(t, h, 3, 200)
	_, st = abiDTRStatus(h)
	assert.Equal(t, dtrStatus{Usage: 700, Budget: 1000, PeakUsage: 700, NextOp: 3, NextTensor: 4}, st)

	require.Equal(t, 0, abiDTRRelease(h, ts[2])) // banished: pending
	_, st = abiDTRStatus(h)
	assert.Equal(t, dtrStatus{Usage: 500, Budget: 1000, Pending: 1, PeakUsage: 700, NextOp: 3, NextTensor: 4}, st)

	require.Equal(t, 0, abiDTRSetBudget(h, 300))
	_, st = abiDTRStatus(h)
	assert.Equal(t, int64(300), st.Budget, "set_budget")
	n, ids := abiDTREvict(h, 0, 8)
	require.Equal(t, int32(2), n, lastError())
	assert.Equal(t, []int64{ts[2], ts[0]}, ids, "the pending storage first, then the budget victim")
	_, st = abiDTRStatus(h)
	assert.Equal(t, dtrStatus{Usage: 300, Budget: 300, BytesEvicted: 200, PeakUsage: 700, NextOp: 3, NextTensor: 4}, st)

	// a failed call updates it too (the budget was changed behind the ABI)
	engineOf(h).SetBudget(123)
	require.Equal(t, -1, abiDTRLock(h, 999999))
	q, st := abiDTRStatus(h)
	assert.Equal(t, int64(123), st.Budget)
	assert.Equal(t, p, q, "the block does not move")

	require.Equal(t, 0, abiDTRDestroy(h))
	assert.Equal(t, blocks, liveStatusBlocks.Load(), "destroy frees the block")
	p, _ = abiDTRStatus(h)
	assert.Zero(t, p)
	assert.Contains(t, lastError(), "memscale_dtr_status_of: unknown engine handle")
}

func TestDTRStatusWithAllocatorUsage(t *testing.T) {
	require.True(t, mallocFreePair(512), lastError())
	h := newTestEngine(t, `{"budget": 0, "usage": "allocator", "device": 0}`)
	base := abiAllocated(0)
	ptr := abiMalloc(1<<20, 0, 0)
	require.NotZero(t, ptr, lastError())
	_, st := abiDTRStatus(h)
	abiFree(ptr, 1<<20, 0, 0)
	assert.Equal(t, base+1<<20, st.Usage, "the allocator's count at the end of the last call (status_of)")
	_, st = abiDTRStatus(h)
	assert.Equal(t, base, st.Usage)
}

// TestDTRPeakWithAllocatorUsage: with usage "allocator" the peak is in the
// budget's units, the allocator's own watermark since the engine was made:
// it sees an allocation made and freed between two engine calls (an op's
// temporary), and nothing from before the engine.
func TestDTRPeakWithAllocatorUsage(t *testing.T) {
	big := abiMalloc(8<<20, 0, 0) // before the engine: not its peak
	require.NotZero(t, big, lastError())
	abiFree(big, 8<<20, 0, 0)
	h := newTestEngine(t, `{"budget": 0, "usage": "allocator", "device": 0}`)
	base := abiAllocated(0)
	tmp := abiMalloc(3<<20, 0, 0)
	require.NotZero(t, tmp, lastError())
	abiFree(tmp, 3<<20, 0, 0)
	m := statsOf(t, h)
	assert.Equal(t, float64(base+3<<20), m["peak_usage"], "the temporary counts, the earlier 8 MiB does not")
	assert.Equal(t, float64(0), m["peak_resident"], "nothing registered")
}

func TestDTREvictExtra(t *testing.T) {
	tests := []struct {
		name  string
		extra int64
		n     int32
		err   string
	}{
		{"negative", -1, -1, "memscale_dtr_evict: extra -1: want the bytes about to be allocated, >= 0"},
		{"none", 0, 1, ""},
		{"room for more", 200, 2, ""},
		{"larger than the budget", 1001, -1, "memscale_dtr_evict: evict: budget 1000 B is below what this step needs " +
			"at this point: 100 B pinned at registration (parameters, inputs) + 0 B pinned later (gradients) + " +
			"0 B locked by the running op + 1001 B requested; the step's minimum budget so far is 1.1 KiB (this point); " +
			"an allocation of 1001 bytes is larger than " +
			"the whole budget of 1000 bytes: raise the budget above 1001 plus the pinned bytes (100 now)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newTestEngine(t, `{"budget": 1000, "heuristic": "lru"}`)
			dtrChain(t, h, 5, 200) // 1100 bytes
			_, before := abiDTRStatus(h)
			n, _ := abiDTREvict(h, tc.extra, 8)
			assert.Equal(t, tc.n, n, lastError())
			_, after := abiDTRStatus(h)
			if tc.err != "" {
				assert.Equal(t, tc.err, lastError())
				assert.Equal(t, before, after, "nothing evicted")
				return
			}
			assert.LessOrEqual(t, after.Usage+tc.extra, after.Budget)
			assert.Equal(t, int64(n)*200, after.BytesEvicted)
		})
	}
	n, _ := abiDTREvict(987654, 0, 8)
	assert.Equal(t, int32(-1), n)
	assert.Contains(t, lastError(), "unknown engine handle 987654")
}

func TestDTRPlanCountsLikeSnprintf(t *testing.T) {
	h := newTestEngine(t, `{"budget": 250, "heuristic": "lru"}`)
	ts := dtrChain(t, h, 3, 100) // 400 bytes: ts[0] and ts[1] go
	n, ids := abiDTREvict(h, 0, 8)
	require.Equal(t, int32(2), n, lastError())
	require.Equal(t, []int64{ts[0], ts[1]}, ids)
	require.Equal(t, 0, abiDTRSetBudget(h, 0))

	clearError()
	before := errorCount()
	assert.Equal(t, int32(2), abiDTRPlanCount(h, ts[1]), "cap 0, NULL arrays: the count")
	for _, capacity := range []int32{0, 1} {
		got, kinds, _ := abiDTRPlan(h, ts[1], capacity)
		assert.Equal(t, int32(2), got, "cap %d", capacity)
		assert.Nil(t, kinds, "cap %d: nothing written", capacity)
	}
	assert.Equal(t, before, errorCount(), "a plan longer than cap is not an error")
	assert.Equal(t, "", lastError())
	assert.Zero(t, engineOf(h).PlanHolds(), "nothing committed")

	got, kinds, steps := abiDTRPlan(h, ts[1], 2)
	require.Equal(t, int32(2), got, lastError())
	assert.Equal(t, []int32{0, 0}, kinds)
	assert.Equal(t, 1, engineOf(h).PlanHolds(), "committed")
	for _, op := range steps {
		require.Equal(t, 0, abiDTRRematerialized(h, op, 5), lastError())
	}
	assert.Zero(t, engineOf(h).PlanHolds())

	// A committed plan abandoned half way: its holds go, and a report of
	// its next step afterwards matches nothing.
	require.Equal(t, 0, abiDTRSetBudget(h, 250))
	n, _ = abiDTREvict(h, 0, 8)
	require.Positive(t, n, lastError())
	require.NotZero(t, abiDTRPlanCount(h, ts[1]), "ts[1] is evicted again")
	got, _, steps = abiDTRPlan(h, ts[1], 8)
	require.Positive(t, got, lastError())
	assert.Equal(t, 1, engineOf(h).PlanHolds())
	require.Equal(t, 1, abiDTRAbandonPlans(h), lastError())
	assert.Zero(t, engineOf(h).PlanHolds(), "abandoned")
	require.Equal(t, 0, abiDTRAbandonPlans(h), "nothing open: fine")
	require.Equal(t, 0, abiDTRSetBudget(h, 0))
	for _, op := range steps {
		require.Equal(t, 0, abiDTRRematerialized(h, op, 5), lastError())
	}
	assert.Zero(t, engineOf(h).PlanHolds())
	assert.Equal(t, -1, abiDTRAbandonPlans(987654))
	assert.Contains(t, lastError(), "memscale_dtr_abandon_plans: unknown engine handle 987654")

	assert.Equal(t, int32(0), abiDTRPlanCount(h, ts[0]), "resident: no steps")
	for _, tc := range []struct {
		name     string
		t        int64
		capacity int32
		want     string
	}{
		{"negative cap", ts[0], -1, "cap -1: want >= 0"},
		{"unknown tensor", 123456, 4, "memscale_dtr_plan: evict: plan:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, _ := abiDTRPlan(h, tc.t, tc.capacity)
			assert.Equal(t, int32(-1), got)
			assert.Contains(t, lastError(), tc.want)
		})
	}
}

func TestDTRFinish(t *testing.T) {
	h := newTestEngine(t, `{"budget": 250, "heuristic": "lru"}`)
	ts := dtrChain(t, h, 2, 100)
	require.Equal(t, 0, abiDTRLock(h, ts[0]))
	require.Equal(t, 0, abiDTRLock(h, ts[1]))
	n, _ := abiDTREvict(h, 0, 8)
	require.Equal(t, int32(-1), n)
	assert.Contains(t, lastError(), "nothing evictable")
	n, _ = abiDTREvict(h, 300, 8)
	require.Equal(t, int32(-1), n)
	assert.Contains(t, lastError(), "larger than the whole budget")
	assert.Equal(t, false, statsOf(t, h)["finished"])

	require.Equal(t, 0, abiDTRFinish(h))
	require.Equal(t, 0, abiDTRFinish(h), "twice is fine")
	// the budget still binds: the errors name what leaves the step
	_, before := abiDTRStatus(h)
	n, _ = abiDTREvict(h, 0, 8)
	assert.Equal(t, int32(-1), n)
	assert.Contains(t, lastError(), "is below what leaves this step")
	n, _ = abiDTREvict(h, 300, 8)
	assert.Equal(t, int32(-1), n)
	assert.Contains(t, lastError(), "larger than the whole budget")
	_, st := abiDTRStatus(h)
	assert.Equal(t, before.Usage, st.Usage, "nothing made resident over the budget")
	assert.Equal(t, true, statsOf(t, h)["finished"])
	assert.Equal(t, -1, abiDTRFinish(987654))
	assert.Contains(t, lastError(), "memscale_dtr_finish: unknown engine handle 987654")
}

func TestDTRStatsJSON(t *testing.T) {
	h := newTestEngine(t, `{"budget": 4096, "heuristic": "auto", "evictee_min_size": 64}`)
	m := statsOf(t, h)
	for _, k := range []string{"evictions", "bytes_evicted", "peak_usage", "usage", "heuristic"} {
		assert.Contains(t, m, k)
	}
	assert.Equal(t, true, m["auto"])
	assert.Equal(t, false, m["finished"])
	assert.Equal(t, "anc-sqrt", m["heuristic"], "the heuristic scoring")
	cfg, ok := m["config"].(map[string]any)
	require.True(t, ok, "config is an object: %v", m["config"])
	assert.Equal(t, 4096.0, cfg["budget"])
	assert.Equal(t, "auto", cfg["heuristic"], "as configured")
	assert.Equal(t, 64.0, cfg["evictee_min_size"])
	assert.Equal(t, "engine", cfg["usage"])
	assert.NotContains(t, cfg, "swap_bandwidth")
	// the config is accepted by create and gives the same config back
	js, err := json.Marshal(cfg)
	require.NoError(t, err)
	again := newTestEngine(t, string(js))
	assert.Equal(t, cfg, statsOf(t, again)["config"])

	m = statsOf(t, newTestEngine(t, `{"usage": "allocator", "device": 0, "swap_bandwidth": 1e9, "heuristic": "msps"}`))
	assert.Equal(t, false, m["auto"])
	cfg = m["config"].(map[string]any)
	assert.Equal(t, "allocator", cfg["usage"])
	assert.Equal(t, 0.0, cfg["device"])
	assert.Equal(t, 1e9, cfg["swap_bandwidth"])
	assert.Equal(t, "msps", cfg["heuristic"])
}

func TestDTRRegionDefaults(t *testing.T) {
	// The library read its configuration already: the region defaults
	// must still see the environment as it is at each create.
	require.True(t, mallocFreePair(512), lastError())
	str := func(s string) *string { return &s }
	tests := []struct {
		name      string
		config    string
		heuristic *string // MEMSCALE_HEURISTIC (nil: unset)
		minSize   *string // MEMSCALE_EVICTEE_MIN_SIZE (nil: unset)
		wantH     string
		wantMin   float64
		wantAuto  bool
	}{
		{"budget", `{"defaults": "region", "budget": 1000000}`, nil, nil, "auto", evict.RegionEvicteeMinSize, true},
		{"no budget", `{"defaults": "region"}`, nil, nil, "default", evict.RegionEvicteeMinSize, false},
		{"environment auto", `{"defaults": "region", "budget": 1000000}`, str("AUTO"), nil, "auto", evict.RegionEvicteeMinSize, true},
		{"environment heuristic", `{"defaults": "region", "budget": 1000000}`, str("lru"), nil, "lru", evict.RegionEvicteeMinSize, false},
		{"environment blank", `{"defaults": "region", "budget": 1000000}`, str(" "), nil, "auto", evict.RegionEvicteeMinSize, true},
		{"environment minimum size", `{"defaults": "region", "budget": 1000000}`, nil, str("4096"), "auto", 4096, true},
		{"caller over region", `{"defaults": "region", "budget": 1000000, "heuristic": "dtr", "evictee_min_size": 0}`,
			str("lru"), str("4096"), "dtr", 0, false},
		{"stress", `{"defaults": "region", "stress": true}`, nil, nil, "default", 0, false},
		{"stress with a budget: no tuning", `{"defaults": "region", "stress": true, "budget": 1000000}`, nil, nil, "default", 0, false},
		{"stress, environment minimum size", `{"defaults": "region", "stress": true}`, nil, str("4096"), "default", 4096, false},
		{"engine defaults", `{"budget": 1000000}`, nil, nil, "default", 0, false},
		{"engine defaults, environment", `{"budget": 1000000}`, str("size"), str("8"), "size", 8, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			setEnv(t, "MEMSCALE_HEURISTIC", tc.heuristic)
			setEnv(t, "MEMSCALE_EVICTEE_MIN_SIZE", tc.minSize)
			m := statsOf(t, newTestEngine(t, tc.config))
			cfg := m["config"].(map[string]any)
			assert.Equal(t, tc.wantH, cfg["heuristic"])
			assert.Equal(t, tc.wantMin, cfg["evictee_min_size"])
			assert.Equal(t, tc.wantAuto, m["auto"])
		})
	}
	setEnv(t, "MEMSCALE_HEURISTIC", nil)
	for _, bad := range []string{`{"defaults": "engine"}`, `{"defaults": true}`} {
		assert.Equal(t, int64(-1), abiDTRCreate(bad))
		assert.Contains(t, lastError(), `accepted "region"`)
	}
	setEnv(t, "MEMSCALE_HEURISTIC", str("fifo"))
	assert.Equal(t, int64(-1), abiDTRCreate(`{"defaults": "region"}`))
	assert.Contains(t, lastError(), "MEMSCALE_HEURISTIC")
}

// TestDTROpIsReleasesCallAndHandOut checks memscale_dtr_op against the
// separate calls it merges: release, call, then the freed storages that
// memscale_dtr_evict would hand out first.
func TestDTROpIsReleasesCallAndHandOut(t *testing.T) {
	f := newDTROpFrame()
	defer f.free()
	h := newTestEngine(t, `{"budget": 100000, "heuristic": "lru"}`)
	x := abiDTRTensor(h, 100, 1)
	op, a, freed := abiDTROp(f, h, nil, []int64{x}, []int64{1000}, []int64{-1}, 10, 0, 8)
	require.GreaterOrEqual(t, op, int64(0), lastError())
	require.Len(t, a, 1)
	assert.Empty(t, freed)
	_, b, _ := abiDTROp(f, h, nil, []int64{a[0]}, []int64{1000}, []int64{-1}, 10, 0, 8)
	// Releasing a (its child b alive) evicts it eagerly: handed out with the op.
	_, c, freed := abiDTROp(f, h, []int64{a[0]}, []int64{b[0]}, []int64{1000, 8}, []int64{-1, 0}, 10, 0, 8)
	require.Len(t, c, 2, lastError())
	assert.Equal(t, [][2]int64{{a[0], int64(evict.Drop)}}, freed)
	_, st := abiDTRStatus(h)
	assert.Equal(t, int64(0), st.Pending)
	assert.Equal(t, int64(100+2000), st.Usage)
	// Releases only.
	op, _, _ = abiDTROp(f, h, []int64{c[1], c[0]}, nil, nil, nil, 0, 0, 0)
	require.Equal(t, int64(0), op, lastError())
	_, st = abiDTRStatus(h)
	assert.Equal(t, int64(1), st.Pending, "c freed, handed out by the next evict or op")
	// Errors name the part of the frame.
	op, _, _ = abiDTROp(f, h, []int64{c[0]}, nil, nil, nil, 0, 0, 0)
	assert.Equal(t, int64(-1), op)
	assert.Contains(t, lastError(), "memscale_dtr_op: released id 0 of 1")
	op, _, _ = abiDTROp(f, h, nil, []int64{b[0]}, []int64{8}, []int64{1}, 10, 0, 0)
	assert.Equal(t, int64(-1), op)
	assert.Contains(t, lastError(), "alias 1: want -1 or an input index")
	op, _, _ = abiDTROp(f, h, nil, []int64{b[0]}, []int64{8}, []int64{-1}, -5, 0, 0)
	assert.Equal(t, int64(-1), op)
	assert.Contains(t, lastError(), "cost_ns -5")
	assert.Equal(t, int64(-1), abiDTROpNoFrame(h))
}

// TestDTROpAllocatesNothingOfItsOwn: beyond what the engine itself keeps
// per op (its graph), memscale_dtr_op allocates nothing for a name it saw.
func TestDTROpAllocatesNothingOfItsOwn(t *testing.T) {
	f := newDTROpFrame()
	defer f.free()
	h := newTestEngine(t, `{}`)
	x := abiDTRTensor(h, 100, 1)
	name := newDTROpFrame() // zeroed: "chain" written below
	defer name.free()
	copy(unsafe.Slice((*byte)(unsafe.Pointer(name.p)), 8), "chain")
	prev := dtrChainStep(f, name, h, x) // the name is interned here
	require.GreaterOrEqual(t, prev, int64(0), lastError())
	viaABI := testing.AllocsPerRun(200, func() { prev = dtrChainStep(f, name, h, prev) })
	require.GreaterOrEqual(t, prev, int64(0), lastError())
	eng, err := evict.New(evict.Config{})
	require.NoError(t, err)
	ins := []rc.TensorID{eng.NewTensor(100, true)}
	outs := []evict.Output{{Size: 1000, Alias: -1}}
	direct := testing.AllocsPerRun(200, func() {
		_, ids, err := eng.Call("chain", ins, outs, 10, 0)
		if err == nil {
			ins[0] = ids[0]
		}
	})
	assert.Equal(t, direct, viaABI, "allocations per op: via the ABI %.2f, the engine alone %.2f", viaABI, direct)
}

// BenchmarkDTROpChainStep is the Go side of a region's per-op call: one
// memscale_dtr_op export (the op's registration, its freed storages back)
// and the release of the previous output, under a budget the chain never
// reaches; "reserved" makes room for the whole chain up front, as a region
// does from its previous step's counts.
func BenchmarkDTROpChainStep(b *testing.B) {
	for _, reserved := range []bool{false, true} {
		name := "growing"
		if reserved {
			name = "reserved"
		}
		b.Run(name, func(b *testing.B) {
			config := `{"budget": 1099511627776, "heuristic": "lru"}`
			if reserved {
				config = fmt.Sprintf(`{"budget": 1099511627776, "heuristic": "lru", "reserve": {"ops": %d, "tensors": %d, "storages": %d}}`,
					b.N+2, b.N+2, b.N+2)
			}
			benchChain(b, config)
		})
	}
}

func benchChain(b *testing.B, config string) {
	f := newDTROpFrame()
	defer f.free()
	name := newDTROpFrame()
	defer name.free()
	copy(unsafe.Slice((*byte)(unsafe.Pointer(name.p)), 8), "chain")
	h := abiDTRCreate(config)
	if h < 0 {
		b.Fatal(lastError())
	}
	defer abiDTRDestroy(h)
	prev := dtrChainStep(f, name, h, abiDTRTensor(h, 100, 1))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		next := dtrChainStep(f, name, h, prev)
		if next < 0 {
			b.Fatal(lastError())
		}
		if abiDTRRelease(h, prev) != 0 {
			b.Fatal(lastError())
		}
		prev = next
	}
}

func TestDTRParkSwapsOutALockedStorage(t *testing.T) {
	h := newTestEngine(t, `{"budget": 1000, "heuristic": "lru", "park": true}`)
	ts := dtrChain(t, h, 3, 200) // the root (pinned) and three outputs
	require.Equal(t, 0, abiDTRLock(h, ts[1]), lastError())
	assert.Equal(t, 1, abiDTRPark(h, ts[1]), lastError())
	_, st := abiDTRStatus(h)
	assert.Equal(t, int64(700-200), st.Usage, "parked: out of the usage (100 pinned + 3 x 200)")
	assert.Equal(t, 0, abiDTRPark(h, ts[1]), "already out: not parked again")
	assert.EqualValues(t, 1, statsOf(t, h)["parked"])
	require.Equal(t, int32(1), abiDTRPlanCount(h, ts[1]), "one swap-in step")

	off := newTestEngine(t, `{"budget": 1000, "heuristic": "lru"}`)
	ts = dtrChain(t, off, 2, 200)
	assert.Equal(t, 0, abiDTRPark(off, ts[1]), "parking off")
	assert.Equal(t, -1, abiDTRPark(off, 12345))
	assert.Contains(t, lastError(), "memscale_dtr_park")
	assert.Equal(t, -1, abiDTRPark(987654, 1))
	assert.Contains(t, lastError(), "unknown engine handle 987654")
}
