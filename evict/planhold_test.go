package evict

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	rc "github.com/memscale/memscale/recompute"
)

// locks returns the lock count of each tensor's storage.
func locks(e *Engine, ts ...rc.TensorID) []int32 {
	out := make([]int32, len(ts))
	for i, t := range ts {
		out[i] = e.Graph().StorageOf(t).Locks
	}
	return out
}

func TestHoldPlanLocksOnlyTheStepAboutToRun(t *testing.T) {
	e := newEngine(t, Config{Heuristic: LRU})
	x := e.NewTensor(100, true)
	ts := chain(t, e, x, 4, 100) // x -> t0 -> t1 -> t2 -> t3
	e.SetBudget(100)
	require.Len(t, evictAll(t, e, 0), 4)
	steps, err := e.Plan(ts[3], nil)
	require.NoError(t, err)
	require.Len(t, steps, 4)
	all := append([]rc.TensorID{x}, ts...)
	require.NoError(t, e.HoldPlan(steps))
	assert.Equal(t, 1, e.PlanHolds())
	assert.Equal(t, []int32{1, 0, 0, 0, 0}, locks(e, all...), "only the first step's input")
	for i, st := range steps {
		require.NoError(t, e.Rematerialized(st.Op, -1))
		want := make([]int32, len(all))
		if i+1 < len(steps) {
			want[i+1] = 1 // the next step's input, just rebuilt
		}
		assert.Equal(t, want, locks(e, all...), "after step %d", i)
	}
	assert.Zero(t, e.PlanHolds())
	// a report that matches no plan changes nothing
	require.NoError(t, e.Rematerialized(steps[3].Op, -1))
	assert.Equal(t, make([]int32, len(all)), locks(e, all...))
}

func TestHoldPlanLetsRebuiltIntermediatesGo(t *testing.T) {
	// A forward chain a1..a4 and a backward one b4 = h(a4), bi = k(b(i+1), ai),
	// all evicted, then b1 is rebuilt under a budget of four storages. The
	// plan is [a1 a2 a3 a4 b4 b3 b2 b1]; holding the inputs of every step
	// until it ran would keep a1..a3 from their rebuild to the end (x, a1..a4
	// and b4: six storages). Holding only the step about to run lets them go;
	// the ones a later step needs are rebuilt by nested plans.
	e := newEngine(t, Config{Heuristic: LRU})
	x := e.NewTensor(100, true)
	a := append([]rc.TensorID{x}, chain(t, e, x, 4, 100)...)
	b := make([]rc.TensorID, 5)
	_, out, err := e.Call("h", []rc.TensorID{a[4]}, []Output{{Size: 100, Alias: -1}}, 10, 0)
	require.NoError(t, err)
	b[4] = out[0]
	for i := 3; i >= 1; i-- {
		_, out, err := e.Call("k", []rc.TensorID{b[i+1], a[i]}, []Output{{Size: 100, Alias: -1}}, 10, 0)
		require.NoError(t, err)
		b[i] = out[0]
	}
	e.SetBudget(100)
	require.Len(t, evictAll(t, e, 0), 8)
	const budget = 400
	e.SetBudget(budget)
	d := &abiDriver{t: t, e: e, budget: budget}
	require.NoError(t, d.materialize(b[1]))
	assert.True(t, e.Graph().IsResident(b[1]))
	assert.Zero(t, e.PlanHolds())
	assert.Positive(t, d.maxNest-1, "some step input was rebuilt by a nested plan")
	assert.Equal(t, make([]int32, 5), locks(e, a...))
}

func TestHoldPlanNestedAndSwapIns(t *testing.T) {
	// a -> b (NoRecompute, swapped out) and c = f(a, b): the plan for c is
	// [swap in b, re-run f]; f's inputs are held from the start, so b stays
	// once it is back.
	e := newEngine(t, Config{Heuristic: LRU, SwapBandwidth: 1}) // b swaps (it cannot be recomputed), c drops
	a := e.NewTensor(100, true)
	_, bs, err := e.Call("g", []rc.TensorID{a}, []Output{{Size: 100, Alias: -1}}, 10, rc.NoRecompute)
	require.NoError(t, err)
	b := bs[0]
	_, cs, err := e.Call("f", []rc.TensorID{a, b}, []Output{{Size: 100, Alias: -1}}, 10, 0)
	require.NoError(t, err)
	c := cs[0]
	e.SetBudget(100)
	vs := evictAll(t, e, 0)
	require.Len(t, vs, 2)
	steps, err := e.Plan(c, nil)
	require.NoError(t, err)
	require.Equal(t, []rc.Step{{Kind: rc.StepSwapIn, Tensor: b}, {Kind: rc.StepRerun, Op: e.Graph().Tensor(c).Op}}, steps)
	require.NoError(t, e.HoldPlan(steps))
	assert.Equal(t, []int32{1, 1}, locks(e, a, b))
	require.NoError(t, e.SwappedIn(b))
	assert.Equal(t, 1, e.PlanHolds())
	assert.Equal(t, []int32{1, 1}, locks(e, a, b))
	// a plan nested in it (c's op reported for another plan first) is
	// matched innermost first
	inner, err := e.Plan(c, nil)
	require.NoError(t, err)
	require.NoError(t, e.HoldPlan(inner))
	assert.Equal(t, 2, e.PlanHolds())
	assert.Equal(t, []int32{2, 2}, locks(e, a, b))
	require.NoError(t, e.Rematerialized(steps[1].Op, -1))
	assert.Equal(t, 1, e.PlanHolds())
	assert.Equal(t, []int32{1, 1}, locks(e, a, b))
	require.NoError(t, e.Rematerialized(steps[1].Op, -1))
	assert.Zero(t, e.PlanHolds())
	assert.Equal(t, []int32{0, 0}, locks(e, a, b))
	// swap-only plans hold nothing
	require.NoError(t, e.HoldPlan([]rc.Step{{Kind: rc.StepSwapIn, Tensor: b}}))
	assert.Zero(t, e.PlanHolds())
	assert.ErrorContains(t, e.HoldPlan([]rc.Step{{Kind: rc.StepRerun, Op: 99}}), "hold plan: step 0")
	assert.ErrorContains(t, e.HoldPlan([]rc.Step{{Kind: 7}}), "unknown kind 7")
}

func TestRerunWithAReleasedOutput(t *testing.T) {
	// topk-like: one op, two outputs; the program drops vals (banished:
	// nothing needs it) and keeps idx, which is evicted and rebuilt.
	e := newEngine(t, Config{Heuristic: LRU})
	x := e.NewTensor(100, true)
	op, outs, err := e.Call("topk", []rc.TensorID{x}, []Output{{Size: 300, Alias: -1}, {Size: 200, Alias: -1}}, 10, 0)
	require.NoError(t, err)
	vals, idx := outs[0], outs[1]
	require.NoError(t, e.Release(vals))
	assert.Equal(t, []Victim{{Tensor: vals, Action: Drop, Size: 300}}, evictAll(t, e, 0))
	e.SetBudget(100)
	assert.Equal(t, []Victim{{Tensor: idx, Action: Drop, Size: 200}}, evictAll(t, e, 0))
	e.SetBudget(1000)
	steps, err := e.Plan(idx, nil)
	require.NoError(t, err)
	require.Equal(t, []rc.Step{{Kind: rc.StepRerun, Op: op}}, steps)
	require.NoError(t, e.HoldPlan(steps))
	require.NoError(t, e.Rematerialized(op, -1), "a released output is re-made as a throw-away copy")
	assert.True(t, e.Graph().IsResident(idx))
	assert.Equal(t, rc.Released, e.Graph().StorageOf(vals).State)
	assert.Equal(t, uint64(300), e.ResidentBytes())
	assert.Equal(t, uint64(600), e.Stats().PeakUsage, "the throw-away copy counts while it exists")
	// the next Evict hands the copy out to be freed
	assert.Equal(t, []Victim{{Tensor: vals, Action: Drop, Size: 300}}, evictAll(t, e, 0))
	assert.Equal(t, int64(1), e.Stats().Rematerializations)
}

func TestNeededReleasedKept(t *testing.T) {
	// autograd's trap: g = mm(d) is evicted while d is resident (g looks
	// cheap), then the program releases d. Dropping d at once would make g
	// cost everything d came from; by default d stays, as an
	// ordinary candidate, until g is back.
	for _, keep := range []bool{false, true} {
		e := newEngine(t, Config{Heuristic: LRU, DropNeededReleased: !keep})
		x := e.NewTensor(100, true)
		ts := chain(t, e, x, 2, 100) // x -> d -> g
		d, g := ts[0], ts[1]
		require.NoError(t, e.Lock(d))
		e.SetBudget(200)
		require.Equal(t, []Victim{{Tensor: g, Action: Drop, Size: 100}}, evictAll(t, e, 0))
		require.NoError(t, e.Unlock(d))
		require.NoError(t, e.Release(d))
		vs := evictAll(t, e, 0)
		gr := e.Graph()
		if !keep {
			assert.Equal(t, []Victim{{Tensor: d, Action: Drop, Size: 100}}, vs, "eager eviction")
			continue
		}
		assert.Empty(t, vs)
		assert.True(t, gr.IsResident(d), "kept for g")
		// an ordinary candidate: a referenced storage used before d goes
		// first under LRU
		_, os, err := e.Call("h", []rc.TensorID{x}, []Output{{Size: 100, Alias: -1}}, 5, 0)
		require.NoError(t, err)
		require.NoError(t, e.Access(d))
		e.SetBudget(200)
		assert.Equal(t, []Victim{{Tensor: os[0], Action: Drop, Size: 100}}, evictAll(t, e, 0),
			"d does not go before a referenced storage")
		// g comes back: d is needed by nothing any more and goes first
		e.SetBudget(1000)
		steps, err := e.Plan(g, nil)
		require.NoError(t, err)
		require.Len(t, steps, 1)
		require.NoError(t, e.HoldPlan(steps))
		require.NoError(t, e.Rematerialized(steps[0].Op, -1))
		require.NoError(t, e.Access(d))
		e.SetBudget(e.Usage() - 1)
		assert.Equal(t, []Victim{{Tensor: d, Action: Drop, Size: 100}}, evictAll(t, e, 0))
	}
}

// checkSoftHolds checks the soft holds against a scan of the open plans:
// each storage's count is the number of reads of it by the re-run steps of
// the open plans not reported yet (from each plan's held step on), and its
// stack lists the plans that read it, innermost first, each with its first
// such step; every entry is in a stack or free.
func checkSoftHolds(t *testing.T, e *Engine, what string) {
	t.Helper()
	g := e.Graph()
	h := &e.soft
	want := make([]int32, g.NumStorages())
	stacks := make([][]softUse, g.NumStorages()) // innermost first
	for i, p := range e.plans {
		require.GreaterOrEqual(t, p.held, 0, "%s: open plan %d holds no step", what, i)
		if i > 0 {
			require.Greater(t, p.seq, e.plans[i-1].seq, "%s: plans in the order they were held", what)
		}
		for k := p.held; k < len(p.steps); k++ {
			if p.steps[k].Kind != rc.StepRerun {
				continue
			}
			for _, in := range g.Op(p.steps[k].Op).Inputs {
				s := g.Tensor(in).Storage
				want[s]++
				if len(stacks[s]) == 0 || stacks[s][0].seq != p.seq {
					stacks[s] = append([]softUse{{seq: p.seq, step: int32(k)}}, stacks[s]...)
				}
			}
		}
	}
	require.LessOrEqual(t, len(h.count), len(want), "%s: soft counts past the last storage", what)
	live := 0
	for s, w := range want {
		var got int32
		var stack []softUse
		if s < len(h.count) {
			got = h.count[s]
			for i := h.top[s]; i != 0; i = h.uses[i-1].below {
				stack = append(stack, softUse{seq: h.uses[i-1].seq, step: h.uses[i-1].step})
			}
			if h.first[s] != 0 { // require only on a mismatch: it costs a stack walk a call (the soak)
				require.Zero(t, h.first[s], "%s: HoldPlan's scratch of storage %d", what, s)
			}
		}
		if w != got || !slices.Equal(stacks[s], stack) {
			require.Equal(t, w, got, "%s: soft holds of storage %d", what, s)
			require.Equal(t, stacks[s], stack, "%s: the plans that read storage %d next", what, s)
		}
		live += len(stack)
	}
	free := 0
	for i := h.free; i != 0; i = h.uses[i-1].below {
		free++
	}
	require.Equal(t, len(h.uses), live+free, "%s: every entry is in a stack or free", what)
}

// softOf returns the soft-hold count of each tensor's storage.
func softOf(e *Engine, ts ...rc.TensorID) []int32 {
	out := make([]int32, len(ts))
	for i, t := range ts {
		if s := e.Graph().Tensor(t).Storage; int(s) < len(e.soft.count) {
			out[i] = e.soft.count[s]
		}
	}
	return out
}

// roomy is a budget nothing in the plan tests comes near.
const roomy = 1 << 20

// skipFixture is, under LRU, x (pinned) -> r = fr(x), t1 = f1(x), t2 = f2(x),
// t3 = f3(t1, t2, r), o = fo(x), every output 100 bytes, with t1 released
// (t3 needs it) and t1..t3 evicted; r is older than o. The plan for t3 is
// [f1 f2 f3]: while f2 runs, t1 (rebuilt, unreferenced, but not dead: the
// evicted t3 needs it) and r (the stalest) are read only by the later step
// f3, and o by nothing.
type skipFixture struct {
	e                 *Engine
	x, r, t1, t2, t3  rc.TensorID
	o                 rc.TensorID
	steps             []rc.Step
	fr, f1, f2, f3    rc.OpID
	all               []rc.TensorID
	usageBeforeRemats uint64
}

func newSkipFixture(t *testing.T, cfg Config) *skipFixture {
	t.Helper()
	cfg.Heuristic = LRU
	cfg.Budget = roomy // a budget: released storages keep their lineage
	e := newEngine(t, cfg)
	f := &skipFixture{e: e}
	one := func(name string, ins ...rc.TensorID) (rc.OpID, rc.TensorID) {
		op, out, err := e.Call(name, ins, []Output{{Size: 100, Alias: -1}}, 10, 0)
		require.NoError(t, err)
		return op, out[0]
	}
	f.x = e.NewTensor(100, true)
	f.fr, f.r = one("fr", f.x)
	f.f1, f.t1 = one("f1", f.x)
	f.f2, f.t2 = one("f2", f.x)
	f.f3, f.t3 = one("f3", f.t1, f.t2, f.r)
	_, f.o = one("fo", f.x)
	require.NoError(t, e.Release(f.t1))
	require.NoError(t, e.Lock(f.r))
	require.NoError(t, e.Lock(f.o))
	e.SetBudget(300)
	evictAll(t, e, 0)
	require.NoError(t, e.Unlock(f.r))
	require.NoError(t, e.Unlock(f.o))
	e.SetBudget(roomy)
	evictAll(t, e, 0) // hand out what the eager eviction freed
	g := e.Graph()
	for _, ts := range []rc.TensorID{f.t1, f.t2, f.t3} {
		require.Equal(t, rc.Evicted, g.StorageOf(ts).State)
	}
	steps, err := e.Plan(f.t3, nil)
	require.NoError(t, err)
	require.Equal(t, []rc.Step{{Kind: rc.StepRerun, Op: f.f1}, {Kind: rc.StepRerun, Op: f.f2}, {Kind: rc.StepRerun, Op: f.f3}}, steps)
	f.steps = steps
	f.all = []rc.TensorID{f.x, f.r, f.t1, f.t2, f.t3, f.o}
	return f
}

func TestSoftHoldCounts(t *testing.T) {
	f := newSkipFixture(t, Config{})
	e := f.e
	require.NoError(t, e.HoldPlan(f.steps))
	checkSoftHolds(t, e, "held")
	//                              x  r  t1 t2 t3 o
	assert.Equal(t, []int32{2, 1, 1, 1, 0, 0}, softOf(e, f.all...), "every read of a re-run step not reported")
	assert.Equal(t, []int32{1, 0, 0, 0, 0, 0}, locks(e, f.all...), "the hard lock stays on the next step's inputs")
	want := [][]int32{
		{1, 1, 1, 1, 0, 0}, // f1 reported: x is still read by f2
		{0, 1, 1, 1, 0, 0}, // f2 reported: f3 reads t1, t2 and r
		{0, 0, 0, 0, 0, 0}, // f3 reported: the plan is done
	}
	for i, st := range f.steps {
		require.NoError(t, e.Rematerialized(st.Op, -1))
		checkSoftHolds(t, e, fmt.Sprintf("step %d", i))
		assert.Equal(t, want[i], softOf(e, f.all...), "after step %d", i)
	}
	assert.Zero(t, e.PlanHolds())
	assert.Zero(t, e.Stats().ReserveEvictions)

	// an input read twice by one step is held twice and released by it
	x := e.NewTensor(100, false)
	op, out, err := e.Call("sq", []rc.TensorID{x, x}, []Output{{Size: 100, Alias: -1}}, 10, 0)
	require.NoError(t, err)
	e.dropStorage(e.Graph().Tensor(out[0]).Storage)
	require.NoError(t, e.HoldPlan([]rc.Step{{Kind: rc.StepRerun, Op: op}}))
	assert.Equal(t, []int32{2}, softOf(e, x))
	assert.Equal(t, []int32{2}, locks(e, x))
	require.NoError(t, e.Rematerialized(op, -1))
	assert.Equal(t, []int32{0}, softOf(e, x))
	assert.Equal(t, []int32{0}, locks(e, x))
	checkSoftHolds(t, e, "squared")
}

// TestReserveCandidatesGoLast: while the plan for t3 runs f2, the budget
// loop, EvictOne and Reclaim take the ordinary candidate o before t1 and r,
// which the later step f3 reads (without soft holds r, the stalest, or t1,
// dead when the keep-needed rule is off, would go first, and f3 would
// rebuild it with a nested plan); with o locked they take a reserve
// candidate, in the ordinary order (dead first, then LRU).
func TestReserveCandidatesGoLast(t *testing.T) {
	evictors := map[string]func(t *testing.T, e *Engine) rc.TensorID{
		"Evict": func(t *testing.T, e *Engine) rc.TensorID {
			e.SetBudget(e.Usage())
			var buf [4]Victim
			n, err := e.Evict(100, buf[:])
			require.NoError(t, err)
			require.Equal(t, 1, n)
			e.SetBudget(roomy)
			return buf[0].Tensor
		},
		"EvictOne": func(t *testing.T, e *Engine) rc.TensorID {
			v, err := e.EvictOne()
			require.NoError(t, err)
			return v.Tensor
		},
		"Reclaim": func(t *testing.T, e *Engine) rc.TensorID {
			var buf [4]Victim
			n, err := e.Reclaim(100, buf[:])
			require.NoError(t, err)
			require.Equal(t, 1, n)
			return buf[0].Tensor
		},
	}
	for _, name := range []string{"Evict", "EvictOne", "Reclaim"} {
		for _, tc := range []struct {
			keep, lockO bool
		}{{true, false}, {true, true}, {false, false}, {false, true}} {
			t.Run(fmt.Sprintf("%s/keep-needed=%v/o locked=%v", name, tc.keep, tc.lockO), func(t *testing.T) {
				f := newSkipFixture(t, Config{DropNeededReleased: !tc.keep})
				e := f.e
				require.NoError(t, e.HoldPlan(f.steps))
				require.NoError(t, e.Rematerialized(f.f1, -1))
				if tc.lockO {
					require.NoError(t, e.Lock(f.o))
				}
				got := evictors[name](t, e)
				// The reserve victim in heuristic order: with keep-needed,
				// t1 is not dead (the evicted t3 needs it) and r, the
				// stalest, goes; without, t1 is dead and goes first.
				victim, rebuild := f.r, f.fr
				if !tc.keep {
					victim, rebuild = f.t1, f.f1
				}
				if !tc.lockO {
					assert.Equal(t, f.o, got, "the ordinary candidate first")
					assert.Zero(t, e.Stats().ReserveEvictions)
				} else {
					assert.Equal(t, victim, got, "only reserve candidates left")
					assert.Equal(t, int64(1), e.Stats().ReserveEvictions)
					assert.Equal(t, []int32{1, 1, 1, 1, 0, 0}, softOf(e, f.all...), "an eviction keeps the counts")
					require.NoError(t, e.Unlock(f.o))
				}
				checkSoftHolds(t, e, "after the eviction")
				require.NoError(t, e.Rematerialized(f.f2, -1))
				if tc.lockO {
					// f3 rebuilds its evicted input with a nested plan first
					inner, err := e.Plan(victim, nil)
					require.NoError(t, err)
					require.Equal(t, []rc.Step{{Kind: rc.StepRerun, Op: rebuild}}, inner)
					require.NoError(t, e.HoldPlan(inner))
					assert.Equal(t, 2, e.PlanHolds())
					checkSoftHolds(t, e, "nested")
					require.NoError(t, e.Rematerialized(rebuild, -1))
				}
				require.NoError(t, e.Rematerialized(f.f3, -1))
				assert.True(t, e.Graph().IsResident(f.t3))
				assert.Zero(t, e.PlanHolds())
				checkSoftHolds(t, e, "done")
				wantRemats := int64(3)
				if tc.lockO {
					wantRemats = 4
				}
				assert.Equal(t, wantRemats, e.Stats().Rematerializations)
			})
		}
	}
}

// TestStressSparesReserveCandidates: stress evicts what no running op or
// open plan needs, so a storage that a later step of an open plan reads is
// evicted only once that step is reported, or the plan abandoned.
func TestStressSparesReserveCandidates(t *testing.T) {
	for _, abandon := range []bool{false, true} {
		t.Run(fmt.Sprintf("abandon=%v", abandon), func(t *testing.T) {
			e := newEngine(t, Config{Stress: true})
			x := e.NewTensor(100, true)
			_, rs, err := e.Call("fr", []rc.TensorID{x}, []Output{{Size: 100, Alias: -1}}, 10, 0)
			require.NoError(t, err)
			r := rs[0]
			ts := chain(t, e, x, 2, 100) // x -> t1 -> t2
			f2, _, err := e.Call("g", []rc.TensorID{ts[1], r}, []Output{{Size: 100, Alias: -1}}, 10, 0)
			require.NoError(t, err)
			t3 := e.Graph().Op(f2).Outputs[0]
			require.NoError(t, e.Lock(r))
			assert.ElementsMatch(t, []rc.TensorID{ts[0], ts[1], t3}, stressVictims(t, e, 0), "r is locked")
			steps, err := e.Plan(t3, nil)
			require.NoError(t, err)
			require.Len(t, steps, 3)
			require.NoError(t, e.HoldPlan(steps))
			require.NoError(t, e.Unlock(r))
			assert.Empty(t, stressVictims(t, e, 0), "r: the plan's last step reads it")
			require.NoError(t, e.Rematerialized(steps[0].Op, -1))
			assert.Empty(t, stressVictims(t, e, 0), "rebuilt storages and r stay")
			if abandon {
				require.NoError(t, e.AbandonPlans())
			} else {
				for _, st := range steps[1:] {
					require.NoError(t, e.Rematerialized(st.Op, -1))
				}
			}
			assert.Equal(t, []rc.TensorID{r}, stressVictims(t, e, 0), "no plan reads r any more")
			assert.Zero(t, e.Stats().ReserveEvictions)
			checkSoftHolds(t, e, "done")
		})
	}
}

func TestAbandonPlans(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, f *skipFixture) // before AbandonPlans
	}{
		{"no plan", func(t *testing.T, f *skipFixture) {}},
		{"held, nothing reported", func(t *testing.T, f *skipFixture) {
			require.NoError(t, f.e.HoldPlan(f.steps))
		}},
		{"one step reported", func(t *testing.T, f *skipFixture) {
			require.NoError(t, f.e.HoldPlan(f.steps))
			require.NoError(t, f.e.Rematerialized(f.f1, -1))
		}},
		{"nested", func(t *testing.T, f *skipFixture) {
			e := f.e
			require.NoError(t, e.HoldPlan(f.steps))
			require.NoError(t, e.Rematerialized(f.f1, -1))
			require.NoError(t, e.Rematerialized(f.f2, -1))
			e.dropStorage(e.Graph().Tensor(f.t1).Storage)
			inner, err := e.Plan(f.t1, nil)
			require.NoError(t, err)
			require.NoError(t, e.HoldPlan(inner))
			require.Equal(t, 2, e.PlanHolds())
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newSkipFixture(t, Config{})
			e := f.e
			tc.run(t, f)
			require.NoError(t, e.AbandonPlans())
			assert.Zero(t, e.PlanHolds())
			checkEngine(t, e, "abandoned") // soft holds and the index's keys
			assert.Equal(t, make([]int32, len(f.all)), locks(e, f.all...))
			assert.Equal(t, make([]int32, len(f.all)), softOf(e, f.all...))
			// a later report matches no plan
			if e.Graph().IsResident(f.t1) {
				require.NoError(t, e.Rematerialized(f.f2, -1))
				assert.Equal(t, make([]int32, len(f.all)), locks(e, f.all...))
			}
			// every resident unpinned storage is an ordinary candidate again
			e.SetBudget(100)
			evictAll(t, e, 0)
			assert.Equal(t, uint64(100), e.Usage(), "only pinned x stays")
		})
	}
}

// TestReserveReadLastGoesFirst: among reserve candidates the one the open
// plans read last goes first, whatever the heuristic says (LRU here: the
// victim is always the one accessed last). The outer plan is [f1 f2 f3],
// f2 reading ra and f3 reading rb; an inner plan [fv fu], held after it,
// reads rb at fu, before anything of the outer plan runs.
func TestReserveReadLastGoesFirst(t *testing.T) {
	tests := []struct {
		name  string
		inner bool
		want  string
	}{
		{"a later step of the same plan", false, "rb"},
		{"an inner plan reads it sooner", true, "ra"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, Config{Heuristic: LRU, Budget: roomy})
			one := func(name string, ins ...rc.TensorID) (rc.OpID, rc.TensorID) {
				op, out, err := e.Call(name, ins, []Output{{Size: 100, Alias: -1}}, 10, 0)
				require.NoError(t, err)
				return op, out[0]
			}
			x := e.NewTensor(100, true)
			_, ra := one("fa", x)
			_, rb := one("fb", x)
			f1, t1 := one("f1", x)
			f2, t2 := one("f2", t1, ra)
			f3, t3 := one("f3", t2, rb)
			fv, v := one("fv", x)
			fu, u := one("fu", v, rb)
			for _, ts := range []rc.TensorID{t1, t2, t3, v, u} {
				e.dropStorage(e.Graph().Tensor(ts).Storage)
			}
			require.NoError(t, e.HoldPlan([]rc.Step{{Kind: rc.StepRerun, Op: f1}, {Kind: rc.StepRerun, Op: f2}, {Kind: rc.StepRerun, Op: f3}}))
			if tc.inner {
				require.NoError(t, e.HoldPlan([]rc.Step{{Kind: rc.StepRerun, Op: fv}, {Kind: rc.StepRerun, Op: fu}}))
			}
			checkSoftHolds(t, e, "held")
			names := map[rc.TensorID]string{ra: "ra", rb: "rb"}
			for _, r := range []rc.TensorID{ra, rb} {
				if names[r] != tc.want {
					require.NoError(t, e.Access(r)) // LRU alone would take it
				}
			}
			e.clock += 10
			for _, r := range []rc.TensorID{ra, rb} {
				if names[r] == tc.want {
					require.NoError(t, e.Access(r))
				}
			}
			v1, err := e.EvictOne()
			require.NoError(t, err)
			assert.Equal(t, tc.want, names[v1.Tensor])
			assert.Equal(t, int64(1), e.Stats().ReserveEvictions)
			checkEngine(t, e, "after the eviction")
		})
	}
}

// TestReleasedWhileSoftHeld: a storage the program releases while a later
// step of an open plan reads it is not dropped eagerly (the step would
// rebuild it at once); once the plan is done it is a dead candidate and goes
// first.
func TestReleasedWhileSoftHeld(t *testing.T) {
	// without the keep-needed rule, which would keep r for the evicted t3
	f := newSkipFixture(t, Config{DropNeededReleased: true})
	e := f.e
	require.NoError(t, e.HoldPlan(f.steps))
	eager := e.Stats().EagerEvictions
	require.NoError(t, e.Release(f.r))
	assert.Equal(t, eager, e.Stats().EagerEvictions)
	assert.True(t, e.Graph().IsResident(f.r), "f3 reads it")
	for _, st := range f.steps {
		require.NoError(t, e.Rematerialized(st.Op, -1))
	}
	assert.True(t, e.Graph().IsResident(f.r))
	// r and the rebuilt t1 are dead: both go before o, accessed before them
	require.NoError(t, e.Access(f.r))
	require.NoError(t, e.Access(f.t1))
	var got []rc.TensorID
	for range 2 {
		v, err := e.EvictOne()
		require.NoError(t, err)
		got = append(got, v.Tensor)
	}
	assert.ElementsMatch(t, []rc.TensorID{f.r, f.t1}, got, "the dead candidates go first")
	assert.Zero(t, e.Stats().ReserveEvictions)
	checkEngine(t, e, "done")
}
