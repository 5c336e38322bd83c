package evict

import (
	"encoding/json"
	"errors"
	"testing"

	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	require.NoError(t, err)
	return e
}

// chain runs n ops x -> t1 -> ... -> tn, each output size bytes and cost
// 10*i ns, and returns the outputs.
func chain(t *testing.T, e *Engine, x rc.TensorID, n int, size uint64) []rc.TensorID {
	t.Helper()
	var out []rc.TensorID
	prev := x
	for i := 1; i <= n; i++ {
		require.NoError(t, e.Access(prev))
		_, ids, err := e.Call("f", []rc.TensorID{prev}, []Output{{Size: size, Alias: -1}}, int64(10*i), 0)
		require.NoError(t, err)
		out = append(out, ids[0])
		prev = ids[0]
	}
	return out
}

func evictAll(t *testing.T, e *Engine, extra uint64) []Victim {
	t.Helper()
	var all []Victim
	var buf [2]Victim
	for {
		n, err := e.Evict(extra, buf[:])
		require.NoError(t, err)
		all = append(all, buf[:n]...)
		if n < len(buf) {
			return all
		}
	}
}

func TestBudgetLoop(t *testing.T) {
	e := newEngine(t, Config{Heuristic: LRU})
	x := e.NewTensor(100, true)
	ts := chain(t, e, x, 5, 100)
	assert.Equal(t, uint64(600), e.Usage())
	e.SetBudget(350)
	vs := evictAll(t, e, 0)
	// LRU: the oldest outputs go first, until usage <= budget
	require.Len(t, vs, 3)
	assert.Equal(t, []rc.TensorID{ts[0], ts[1], ts[2]}, []rc.TensorID{vs[0].Tensor, vs[1].Tensor, vs[2].Tensor})
	for _, v := range vs {
		assert.Equal(t, Drop, v.Action)
		assert.Equal(t, uint64(100), v.Size)
	}
	assert.Equal(t, uint64(300), e.Usage())
	// making room for 51 more bytes takes one more
	vs = evictAll(t, e, 51)
	require.Len(t, vs, 1)
	assert.Equal(t, ts[3], vs[0].Tensor)
	st := e.Stats()
	assert.Equal(t, int64(4), st.Evictions)
	assert.Equal(t, uint64(600), st.PeakUsage)
}

func TestBudgetLoopOutOfMemory(t *testing.T) {
	e := newEngine(t, Config{})
	x := e.NewTensor(100, true)
	ts := chain(t, e, x, 2, 100)
	require.NoError(t, e.Lock(ts[0]))
	require.NoError(t, e.Pin(ts[1]))
	e.SetBudget(150)
	var buf [4]Victim
	n, err := e.Evict(0, buf[:])
	require.ErrorIs(t, err, ErrNoEvictable)
	assert.Equal(t, 0, n)
	assert.ErrorContains(t, err, "usage 300")
	assert.ErrorContains(t, err, "budget 150")
	// unlocking makes room
	require.NoError(t, e.Unlock(ts[0]))
	n, err = e.Evict(0, buf[:])
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, ts[0], buf[0].Tensor)
}

func TestEvicteeMinSize(t *testing.T) {
	e := newEngine(t, Config{EvicteeMinSize: 64, Heuristic: LRU})
	x := e.NewTensor(8, true)
	small := chain(t, e, x, 1, 10)[0]
	big := chain(t, e, small, 1, 100)[0]
	e.SetBudget(50)
	vs := evictAll(t, e, 0)
	require.Len(t, vs, 1, "the small storage is not a candidate")
	assert.Equal(t, big, vs[0].Tensor)
	assert.Zero(t, e.Candidates(), "the small one is not a candidate, x is pinned")
	assert.True(t, e.Graph().IsResident(small))
}

func TestEagerEvictionOnRelease(t *testing.T) {
	e := newEngine(t, Config{Budget: 1 << 30})
	x := e.NewTensor(100, true)
	ts := chain(t, e, x, 3, 100)
	// ts[0] has a live child (ts[1]): it is dropped but stays recomputable
	require.NoError(t, e.Release(ts[0]))
	assert.Equal(t, uint64(300), e.Usage())
	vs := evictAll(t, e, 0)
	require.Equal(t, []Victim{{Tensor: ts[0], Action: Drop, Size: 100}}, vs, "handed out by the next Evict")
	assert.Equal(t, rc.Evicted, e.Graph().StorageOf(ts[0]).State)
	assert.Equal(t, int64(1), e.Stats().EagerEvictions)
	// released twice is an error
	assert.ErrorContains(t, e.Release(ts[0]), "no references left")
	assert.ErrorContains(t, e.Retain(ts[0]), "no references")
}

// A storage freed at a release waits in the pending queue until the caller's
// next op or Evict. A plan made meanwhile rebuilds it (the caller still
// holds its data); it must not be handed out after that, or the caller drops
// data the engine counts resident (the native region's exit failed that way:
// "the engine holds storage N resident, but the region has no data for it").
func TestRebuiltPendingStorageIsNotHandedOut(t *testing.T) {
	for _, tc := range []struct {
		name     string
		handOut  func(e *Engine) []Victim
		evictMid bool // evicted again after the rebuild: handed out once
	}{
		{"evict", func(e *Engine) []Victim { return evictAll(t, e, 0) }, false},
		{"hand out pending", func(e *Engine) []Victim {
			var buf [4]Victim
			return buf[:e.HandOutPending(buf[:])]
		}, false},
		{"evicted again", func(e *Engine) []Victim { return evictAll(t, e, 0) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, Config{Budget: 1 << 30, Heuristic: LRU})
			x := e.NewTensor(100, true)
			ts := chain(t, e, x, 3, 100)
			require.NoError(t, e.Release(ts[0])) // eager: dropped, queued
			require.Equal(t, 1, e.Pending())
			steps, err := e.Plan(ts[0], nil)
			require.NoError(t, err)
			require.Len(t, steps, 1)
			require.NoError(t, e.HoldPlan(steps))
			require.NoError(t, e.Rematerialized(steps[0].Op, -1))
			require.Equal(t, rc.Resident, e.Graph().StorageOf(ts[0]).State)
			assert.Equal(t, 0, e.Pending(), "the rebuilt storage left the queue")
			var want []Victim
			wantUsage := uint64(400)
			if tc.evictMid {
				// Released and only rebuilt: the first victim of a lower budget.
				e.SetBudget(300)
				want = []Victim{{Tensor: ts[0], Action: Drop, Size: 100}}
				wantUsage = 300
			}
			got := tc.handOut(e)
			if want == nil {
				assert.Empty(t, got)
			} else {
				assert.Equal(t, want, got, "handed out once, for the new eviction")
			}
			assert.Equal(t, wantUsage, e.Usage())
		})
	}
}

func TestBanishing(t *testing.T) {
	e := newEngine(t, Config{Budget: 1 << 30})
	w := e.NewTensor(1000, true) // a parameter
	ts := chain(t, e, w, 3, 100)
	require.NoError(t, e.Release(w))
	assert.Equal(t, uint64(1300), e.Usage(), "pinned parameter kept: its children may need it")
	// release the chain from the end: each storage is banished once its
	// dependents are gone, and the parameter with them
	require.NoError(t, e.Release(ts[2]))
	require.NoError(t, e.Release(ts[1]))
	assert.Equal(t, rc.Released, e.Graph().StorageOf(ts[2]).State)
	assert.Equal(t, rc.Released, e.Graph().StorageOf(ts[1]).State)
	assert.Equal(t, uint64(1100), e.Usage())
	require.NoError(t, e.Release(ts[0]))
	assert.Equal(t, rc.Released, e.Graph().StorageOf(w).State)
	assert.Zero(t, e.Usage())
	vs := evictAll(t, e, 0)
	assert.Len(t, vs, 4, "every freed storage is handed out")
	assert.Equal(t, int64(4), e.Stats().Banished)
}

func TestSimulatorCompatKeepsReleased(t *testing.T) {
	e := newEngine(t, Config{Budget: 1 << 30, SimulatorCompat: true})
	w := e.NewTensor(1000, true)
	ts := chain(t, e, w, 2, 100)
	require.NoError(t, e.Release(w))
	require.NoError(t, e.Release(ts[1]))
	require.NoError(t, e.Release(ts[0]))
	assert.Equal(t, rc.Resident, e.Graph().StorageOf(w).State, "pinned stays")
	assert.Equal(t, rc.Evicted, e.Graph().StorageOf(ts[1]).State, "dropped, not banished")
	steps, err := e.Plan(ts[1], nil)
	require.NoError(t, err)
	assert.Len(t, steps, 2, "still recomputable")
}

func TestUnlimitedBudgetFreesOnRelease(t *testing.T) {
	e := newEngine(t, Config{})
	w := e.NewTensor(1000, true)
	ts := chain(t, e, w, 2, 100)
	require.NoError(t, e.Release(w))
	assert.Equal(t, uint64(200), e.Usage(), "unlimited budget: nothing needs lineage, freed at once")
	assert.True(t, e.Graph().StorageOf(ts[0]).NoRecompute, "its child can no longer be recomputed")
}

func TestPlanHoldAndRematerialize(t *testing.T) {
	e := newEngine(t, Config{Heuristic: LRU})
	x := e.NewTensor(100, true)
	ts := chain(t, e, x, 4, 100)
	e.SetBudget(300)
	vs := evictAll(t, e, 0)
	require.Len(t, vs, 2) // ts[0], ts[1]
	steps, err := e.Plan(ts[1], nil)
	require.NoError(t, err)
	require.Len(t, steps, 2)
	require.NoError(t, e.HoldPlan(steps))
	// room for the first step: only ts[2] and ts[3] are candidates
	vs = evictAll(t, e, 100)
	require.Len(t, vs, 1)
	assert.Equal(t, ts[2], vs[0].Tensor)
	require.NoError(t, e.Rematerialized(steps[0].Op, -1))
	assert.True(t, e.Graph().IsResident(ts[0]))
	// ts[0] is the input of step 2: held, not a candidate
	vs = evictAll(t, e, 100)
	require.Len(t, vs, 1)
	assert.Equal(t, ts[3], vs[0].Tensor)
	require.NoError(t, e.Rematerialized(steps[1].Op, 25))
	assert.True(t, e.Graph().IsResident(ts[1]))
	assert.Zero(t, e.Graph().StorageOf(ts[0]).Locks, "hold released")
	st := e.Stats()
	assert.Equal(t, int64(2), st.Rematerializations)
	assert.Equal(t, int64(10+25), st.RematCostNS)
	// re-running an op whose input is gone fails
	assert.ErrorContains(t, e.Rematerialized(rc.OpID(3), -1), "not resident")
}

func TestDeadStoragesGoFirst(t *testing.T) {
	e := newEngine(t, Config{Heuristic: LRU})
	x := e.NewTensor(100, true)
	ts := chain(t, e, x, 3, 100)
	// drop ts[0] and ts[1] (LRU: oldest first), then release ts[0]: it is
	// kept, evicted, for recomputing ts[1]
	e.SetBudget(200)
	vs := evictAll(t, e, 0)
	require.Len(t, vs, 2)
	require.NoError(t, e.Release(ts[0]))
	// bring ts[1] back: ts[0] is rebuilt on the way and has no references
	e.SetBudget(1 << 20)
	steps, err := e.Plan(ts[1], nil)
	require.NoError(t, err)
	require.Len(t, steps, 2)
	require.NoError(t, e.HoldPlan(steps))
	for _, st := range steps {
		require.NoError(t, e.Rematerialized(st.Op, -1))
	}
	require.True(t, e.Graph().IsResident(ts[0]))
	// make ts[0] the most recently used: LRU alone would keep it, but an
	// unreferenced storage goes before any referenced one
	require.NoError(t, e.Access(ts[0]))
	e.SetBudget(e.Usage() - 1)
	vs = evictAll(t, e, 0)
	require.Len(t, vs, 1)
	assert.Equal(t, ts[0], vs[0].Tensor)
}

func TestSwapDecision(t *testing.T) {
	for _, tc := range []struct {
		name string
		bw   float64
		want Action
	}{
		{"slow link: recompute", 1, Drop},
		{"fast link: swap", 1e15, Swap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, Config{SwapBandwidth: tc.bw, Heuristic: LRU})
			x := e.NewTensor(100, true)
			ts := chain(t, e, x, 2, 1000)
			e.SetBudget(1100)
			vs := evictAll(t, e, 0)
			require.Len(t, vs, 1)
			assert.Equal(t, tc.want, vs[0].Action)
			steps, err := e.Plan(ts[0], nil)
			require.NoError(t, err)
			if tc.want == Swap {
				require.Equal(t, []rc.Step{{Kind: rc.StepSwapIn, Tensor: ts[0]}}, steps)
				require.NoError(t, e.SwappedIn(ts[0]))
				assert.True(t, e.Graph().IsResident(ts[0]))
				assert.Equal(t, int64(1), e.Stats().SwapsIn)
				assert.ErrorContains(t, e.SwappedIn(ts[0]), "not swapped")
			} else {
				require.Equal(t, rc.StepRerun, steps[0].Kind)
			}
		})
	}
	// an external tensor has no lineage: with swapping on it is swapped
	e := newEngine(t, Config{SwapBandwidth: 1, Budget: 50})
	x := e.NewTensor(100, false)
	vs := evictAll(t, e, 0)
	require.Equal(t, []Victim{{Tensor: x, Action: Swap, Size: 100}}, vs)
	// and without swapping it is never a candidate
	e = newEngine(t, Config{Budget: 50})
	e.NewTensor(100, false)
	_, err := e.Evict(0, make([]Victim, 1))
	require.ErrorIs(t, err, ErrNoEvictable)
}

func TestMutate(t *testing.T) {
	e := newEngine(t, Config{Budget: 1 << 30})
	w := e.NewTensor(100, true)
	g := e.NewTensor(100, false)
	before := e.Usage()
	_, ids, err := e.Mutate("add_", []rc.TensorID{w, g}, []int{0}, 5, 0)
	require.NoError(t, err)
	require.Len(t, ids, 1)
	assert.Equal(t, before, e.Usage(), "the new version lives in the old memory")
	assert.Equal(t, before, e.Stats().PeakUsage)
	nw := e.Graph().StorageOf(ids[0])
	assert.Equal(t, int32(1), nw.Pins, "pins move to the new version")
	assert.Equal(t, rc.Evicted, e.Graph().StorageOf(w).State)
	_, err = e.Plan(w, nil)
	require.ErrorIs(t, err, rc.ErrNotRecomputable, "the old parameter value is gone")
	_, _, err = e.Mutate("bad", []rc.TensorID{g}, []int{1}, 1, 0)
	assert.ErrorContains(t, err, "out of range")
	_, _, err = e.Mutate("bad", []rc.TensorID{g, g}, []int{0, 0}, 1, 0)
	assert.ErrorContains(t, err, "listed twice")
}

func TestEngineErrors(t *testing.T) {
	e := newEngine(t, Config{})
	x := e.NewTensor(10, false)
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"unlock unlocked", e.Unlock(x), "not locked"},
		{"unpin unpinned", e.Unpin(x), "not pinned"},
		{"access unknown", e.Access(42), "unknown tensor"},
		{"lock unknown", e.Lock(-1), "unknown tensor"},
		{"release unknown", e.Release(42), "unknown tensor"},
		{"rematerialized unknown", e.Rematerialized(7, -1), "unknown op"},
		{"hold unknown", e.HoldPlan([]rc.Step{{Op: 3}}), "unknown op"},
		{"plan unknown", func() error { _, err := e.Plan(9, nil); return err }(), "unknown tensor"},
		{"swapped in unknown", e.SwappedIn(99), "unknown tensor"},
		{"call on unknown", func() error { _, _, err := e.Call("f", []rc.TensorID{5}, nil, 1, 0); return err }(), "unknown tensor"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Error(t, tc.err)
			assert.ErrorContains(t, tc.err, tc.want)
		})
	}
	_, err := New(Config{RecompTimeFactor: -1})
	assert.ErrorContains(t, err, "recomp_time_factor")
}

func TestExternalUsageSource(t *testing.T) {
	used := uint64(0)
	e := newEngine(t, Config{Heuristic: LRU, Usage: func() uint64 { return used }})
	x := e.NewTensor(100, true)
	chain(t, e, x, 4, 100)
	used = 500 // the allocator agrees with the engine
	e.SetBudget(300)
	// Within one call the victims are not freed yet: Evict discounts what it
	// evicted in this call, so it stops after two.
	var buf [8]Victim
	n, err := e.Evict(0, buf[:])
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	for _, v := range buf[:n] {
		used -= v.Size // the caller frees them
	}
	n, err = e.Evict(0, buf[:])
	require.NoError(t, err)
	assert.Zero(t, n)
}

// TestExternalUsageOutside: memory the source counts but the engine does not
// hold (allocated before the region) makes the budget infeasible: the error
// says so and how much; the peak is in the source's units.
func TestExternalUsageOutside(t *testing.T) {
	used := uint64(0)
	e := newEngine(t, Config{Heuristic: LRU, Usage: func() uint64 { return used }})
	e.NewTensor(300, true) // pinned: nothing evictable
	used = 5000 + 300      // 5000 bytes outside the engine
	e.SetBudget(1000)
	var buf [8]Victim
	_, err := e.Evict(0, buf[:])
	require.ErrorIs(t, err, ErrNoEvictable)
	assert.Contains(t, err.Error(), "of the allocator's 5.2 KiB in use is memory this engine does not hold")
	assert.Contains(t, err.Error(), "(usage \"engine\")")
	st := e.Stats()
	assert.Equal(t, uint64(5300), st.PeakUsage, "the source's units")
	assert.Equal(t, uint64(300), st.PeakResident)

	// Outside memory small and the pinned bytes alone over the budget: the
	// floor is the reason, no note.
	used = 300 + 10
	e.SetBudget(250)
	_, err = e.Evict(0, buf[:])
	require.ErrorIs(t, err, ErrNoEvictable)
	assert.NotContains(t, err.Error(), "does not hold")
}

func TestStatsJSONKeys(t *testing.T) {
	e := newEngine(t, Config{Budget: 10})
	b, err := json.Marshal(e.Stats())
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	for _, k := range []string{"evictions", "rematerializations", "swaps_out", "swaps_in", "base_cost_ns",
		"remat_cost_ns", "usage", "peak_usage", "peak_resident", "budget", "candidates", "bytes_evicted", "auto", "finished",
		"min_budget", "min_budget_parts"} {
		assert.Contains(t, m, k)
	}
}

func TestDecodeConfig(t *testing.T) {
	base := Config{Heuristic: LRU, RecompTimeFactor: 2}
	tests := []struct {
		name string
		in   string
		want Config
		src  UsageSource
		err  string
	}{
		{"empty", "", base, UsageSource{}, ""},
		{"braces", "{}", base, UsageSource{}, ""},
		{"all", `{"budget": 1024, "heuristic": "dtr-eq", "recomp_time_factor": 1.5, "recomp_memory_factor": 0.5,
			"evictee_min_size": 4096, "swap_bandwidth": 1.2e10, "usage": "allocator", "device": 1, "simulator_compat": true}`,
			Config{Budget: 1024, Heuristic: DTREq, RecompTimeFactor: 1.5, RecompMemoryFactor: 0.5, EvicteeMinSize: 4096,
				SwapBandwidth: 1.2e10, SimulatorCompat: true}, UsageSource{Allocator: true, Device: 1}, ""},
		{"keep needed released", `{"keep_needed_released": true}`, Config{Heuristic: LRU, RecompTimeFactor: 2}, UsageSource{}, ""},
		{"drop needed released", `{"keep_needed_released": false}`, Config{Heuristic: LRU, RecompTimeFactor: 2, DropNeededReleased: true}, UsageSource{}, ""},
		{"bad keep needed released", `{"keep_needed_released": 1}`, base, UsageSource{}, "keep_needed_released 1: want true or false"},
		{"default heuristic", `{"heuristic": "default"}`, Config{Heuristic: Default, RecompTimeFactor: 2}, UsageSource{}, ""},
		{"usage engine", `{"usage": "engine"}`, base, UsageSource{}, ""},
		{"unknown key", `{"budgte": 1}`, base, UsageSource{}, `unknown key "budgte"`},
		{"negative budget", `{"budget": -1}`, base, UsageSource{}, "budget -1"},
		{"fractional budget", `{"budget": 1.5}`, base, UsageSource{}, "whole number"},
		{"string budget", `{"budget": "1GiB"}`, base, UsageSource{}, "want a number"},
		{"bad heuristic", `{"heuristic": "fifo"}`, base, UsageSource{}, `unknown heuristic "fifo"`},
		{"bad usage", `{"usage": "gpu"}`, base, UsageSource{}, `usage "gpu"`},
		{"bad factor", `{"recomp_time_factor": -2}`, base, UsageSource{}, "recomp_time_factor -2"},
		{"not an object", `[1]`, base, UsageSource{}, "not a JSON object"},
		{"reserve", `{"reserve": {"ops": 10, "tensors": 20, "storages": 15}}`,
			Config{Heuristic: LRU, RecompTimeFactor: 2, Reserve: GraphSize{Ops: 10, Tensors: 20, Storages: 15}}, UsageSource{}, ""},
		{"reserve unknown key", `{"reserve": {"opz": 1}}`, base, UsageSource{}, "reserve"},
		{"reserve negative", `{"reserve": {"ops": -1}}`, base, UsageSource{}, "reserve"},
		{"reserve huge", `{"reserve": {"tensors": 1e12}}`, base, UsageSource{}, "reserve"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, src, err := DecodeConfig([]byte(tc.in), base)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, cfg)
			assert.Equal(t, tc.src, src)
		})
	}
}

func TestVictimCallback(t *testing.T) {
	var got []EvictReason
	e := newEngine(t, Config{Heuristic: LRU, OnEvict: func(_ Victim, why EvictReason) { got = append(got, why) }})
	x := e.NewTensor(100, true)
	ts := chain(t, e, x, 3, 100)
	e.SetBudget(350)
	evictAll(t, e, 0)
	require.NoError(t, e.Release(ts[2]))
	assert.Equal(t, []EvictReason{ReasonBudget, ReasonBanish}, got)
	assert.False(t, errors.Is(nil, ErrNoEvictable))
}

// Status reports what Stats does for the fields the status block carries,
// with a budget, after evictions, with an allocator's usage and in stress mode.
func TestStatusMatchesStats(t *testing.T) {
	var allocated uint64 = 12345
	cases := []struct {
		name string
		cfg  Config
	}{
		{"budgeted", Config{Heuristic: LRU}},
		{"allocator usage", Config{Heuristic: LRU, Usage: func() uint64 { return allocated }, UsagePeak: func() uint64 { return 99999 }}},
		{"stress", Config{Heuristic: LRU, Stress: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, tc.cfg)
			x := e.NewTensor(100, true)
			chain(t, e, x, 5, 100)
			e.SetBudget(350)
			evictAll(t, e, 0)
			s, st := e.Stats(), e.Status()
			assert.Equal(t, Status{Usage: s.Usage, Budget: s.Budget, PeakUsage: s.PeakUsage, BytesEvicted: s.BytesEvicted}, st)
		})
	}
}
