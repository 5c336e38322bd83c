package evict

import (
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
