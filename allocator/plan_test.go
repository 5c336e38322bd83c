package allocator

import (
	"math/rand"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/device"
)

// planStep runs one deterministic "training step" at about budget bytes
// live: large blocks of varying sizes replace each other as a DTR engine at
// its budget makes them, with small ones in between; everything is freed at
// the end unless keep says how many of the last blocks stay live (returned).
func planStep(t *testing.T, a *Allocator, budget uint64, seed int64, keep int) []device.Ptr {
	t.Helper()
	return planStepVary(t, a, budget, seed, keep, -1)
}

// planStepVary is planStep with request number vary (>= 0) 3 MiB larger
// (the rest of the step unchanged).
func planStepVary(t *testing.T, a *Allocator, budget uint64, seed int64, keep, vary int) []device.Ptr {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	var live liveAtBudget
	for i := 0; i < 300; i++ {
		size := uint64(4+rng.Intn(60)) << 20
		if i%5 == 0 {
			size = uint64(1+rng.Intn(900)) << 10 // small pool
		}
		asked := size
		if i == vary {
			asked += 3 << 20 // the engine's accounting (used) is not changed
		}
		live.alloc(t, a, budget, size, asked, rng.Intn)
	}
	require.NoError(t, a.checkInvariants())
	n := len(live.ptrs) - keep
	freeAll(t, a, live.ptrs[:n])
	return live.ptrs[n:]
}

// TestStepPlanStopsRemaps: told the budget and where steps begin, an
// allocator that repeats the same step places it by the plan of the step
// before from the third step on: no granule is remapped, reserved memory
// stays within the budget's bound, and without the boundaries the same
// steps remap.
func TestStepPlanStopsRemaps(t *testing.T) {
	const budget = 1 << 30
	run := func(boundaries bool) []Stats {
		a, _ := newTestAllocator(t, Config{Budget: budget, BudgetSlack: 0.4})
		var out []Stats
		for step := 0; step < 5; step++ {
			if boundaries {
				a.StepBoundary()
			}
			planStep(t, a, budget, 1, 0)
			out = append(out, a.Stats())
		}
		return out
	}
	plain := run(false)
	planned := run(true)
	plainSteady := plain[4]["num_remap"] - plain[0]["num_remap"]
	for i := 2; i < 5; i++ {
		require.Zero(t, planned[i]["num_remap"]-planned[i-1]["num_remap"], "step %d remaps nothing", i+1)
		require.Equal(t, int64(1), planned[i]["step_plan_active"])
		require.Zero(t, planned[i]["num_step_plan_missed"]-planned[i-1]["num_step_plan_missed"], "step %d: every large request placed by the plan", i+1)
	}
	require.Positive(t, plainSteady, "without step boundaries the same steps remap")
	last := planned[4]
	require.Equal(t, int64(5), last["num_steps"])
	require.Positive(t, last["num_step_plan_placed"])
	require.Positive(t, last["num_step_plans_reused"], "an unchanged step keeps its plan")
	require.LessOrEqual(t, last["reserved_bytes.all.peak"], int64(budget+2*budget/5))
	require.LessOrEqual(t, last["step_plan_need_bytes"], int64(budget+2*budget/5))
}

// TestStepPlanRobust: steps that differ from the plan, blocks live across a
// boundary, frees waiting on recorded streams, EmptyCache and a plan that
// does not fit keep the allocator consistent and every live block disjoint.
func TestStepPlanRobust(t *testing.T) {
	const budget = 512 << 20
	a, d := newTestAllocator(t, Config{Budget: budget, BudgetSlack: 0.5})
	var kept []device.Ptr
	busy := false
	for step := 0; step < 12; step++ {
		a.StepBoundary()
		require.NoError(t, a.checkInvariants())
		seed := int64(step % 3) // the same steps recur, with others in between
		if step%4 == 3 {
			seed = int64(100 + step)
		}
		if busy {
			d.SetStreamBusy(7, false) // the pending free of the last step completes
			busy = false
		}
		if step%5 == 2 {
			// A block freed with a recorded stream, pending across the
			// next boundary.
			p, err := a.Malloc(8<<20, 1)
			require.NoError(t, err)
			require.NoError(t, a.RecordStream(p, 7))
			d.SetStreamBusy(7, true)
			require.NoError(t, a.Free(p))
			busy = true
		}
		for _, q := range kept {
			require.NoError(t, a.Free(q))
		}
		kept = planStep(t, a, budget, seed, step%3)
		if step == 8 {
			require.NoError(t, a.EmptyCache())
		}
		if step == 9 {
			a.SetBudget(budget / 8) // a plan that cannot fit: best fit again
		}
		require.NoError(t, a.checkInvariants())
	}
	for _, q := range kept {
		require.NoError(t, a.Free(q))
	}
	d.SetStreamBusy(7, false)
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.checkInvariants())
	st := a.Stats()
	require.Positive(t, st["num_step_plans"])
	require.Positive(t, st["num_step_plan_placed"])
	require.Positive(t, st["num_step_plan_missed"], "the steps that differ miss their plan")
	require.Zero(t, st["step_plan_active"], "the plan retired when it no longer fit")
	require.Zero(t, st["allocated_bytes.all.current"])
}

// TestStepPlanOff: NoStepPlan, or no budget, leaves StepBoundary counting
// steps only.
func TestStepPlanOff(t *testing.T) {
	for _, cfg := range []Config{{Budget: 1 << 30, NoStepPlan: true}, {}} {
		a, _ := newTestAllocator(t, cfg)
		for step := 0; step < 3; step++ {
			a.StepBoundary()
			planStep(t, a, 1<<30, 1, 0)
		}
		st := a.Stats()
		require.Zero(t, st["num_step_plans"])
		require.Zero(t, st["num_step_plan_placed"])
	}
}

// TestStepPlanBudgetWithdrawn: a region's engine withdraws its budget when
// the region exits, before the program's step boundary; the plan follows
// the budget the step ran under.
func TestStepPlanBudgetWithdrawn(t *testing.T) {
	const budget = 1 << 30
	a, _ := newTestAllocator(t, Config{BudgetSlack: 0.4})
	var last Stats
	for step := 0; step < 4; step++ {
		a.StepBoundary()
		a.SetBudget(budget) // the region's entry
		planStep(t, a, budget, 1, 0)
		a.SetBudget(0) // its exit
		last = a.Stats()
	}
	require.Equal(t, int64(1), last["step_plan_active"])
	require.Positive(t, last["num_step_plan_placed"])
	require.Zero(t, last["num_step_plan_missed"])
}

// noRestarts turns the plan search's restarts off for the test: the churn
// of planStep then needs a plan over the bound (with them it fits).
func noRestarts(t *testing.T) {
	t.Helper()
	searchRestarts = 0
	t.Cleanup(func() { searchRestarts = planRestarts })
}

// TestStepPlanOverBound: a plan that needs more than the bound (up to
// planOver x it) is used; the granules it cannot hold at once are remapped
// within the step, fewer than best fit remaps on this churn, and the
// allocator stays consistent throughout.
func TestStepPlanOverBound(t *testing.T) {
	const budget = 1 << 30
	noRestarts(t)
	const steps = 9
	run := func(boundaries bool) (per []int64, last Stats) {
		a, _ := newTestAllocator(t, Config{Budget: budget, BudgetSlack: 0.2})
		prev := a.Stats()
		for step := 0; step < steps; step++ {
			if boundaries {
				a.StepBoundary()
			}
			planStep(t, a, budget, 1, 0)
			require.NoError(t, a.checkInvariants())
			st := a.Stats()
			per = append(per, st["num_remap"]-prev["num_remap"])
			prev = st
		}
		return per, prev
	}
	plain, _ := run(false)
	planned, st := run(true)
	t.Logf("granules remapped per step: best fit %v, with boundaries %v", plain, planned)
	require.Equal(t, int64(1), st["step_plan_active"])
	require.Greater(t, float64(st["step_plan_need_bytes"]), 1.2*budget, "the plan needs more than the bound")
	var p, f int64
	for i := 2; i < steps; i++ {
		require.Positive(t, planned[i], "a plan over the bound remaps")
		p += planned[i]
		f += plain[i]
	}
	require.Less(t, 2*p, f, "half as many remaps as best fit at most")
}

// TestStepPlanOverDropped: a plan over the bound that, past its first step,
// remaps more than best fit did is dropped, and plans over the bound wait
// (1, 3, 7 ... boundaries) before the next try.
func TestStepPlanOverDropped(t *testing.T) {
	const budget = 1 << 30
	noRestarts(t)
	a, _ := newTestAllocator(t, Config{Budget: budget, BudgetSlack: 0.2})
	for step := 0; step < 3; step++ {
		a.StepBoundary()
		planStep(t, a, budget, 1, 0)
	}
	// Read under the lock, checked after it (a failing require under a.mu
	// would leave the cleanup's Close waiting on it forever).
	a.mu.Lock()
	p := a.plans
	active, need, bound, activeSteps := p.active, p.lastNeed, a.planBound(budget), p.activeSteps
	a.mu.Unlock()
	require.True(t, active)
	require.Greater(t, need, bound, "the plan is over the bound")
	require.GreaterOrEqual(t, activeSteps, 1)
	a.mu.Lock()
	p.cur.runs = max(p.cur.runs, 1)
	// The step just ended remapped more than best fit did.
	p.fitRemaps = 1
	p.cur.fit = 1
	a.cnt.remaps = p.remaps0 + 2
	a.mu.Unlock()
	a.StepBoundary()
	st := a.Stats()
	require.Zero(t, st["step_plan_active"], "dropped")
	a.mu.Lock()
	overFails, overSkip := p.overFails, p.overSkip
	a.mu.Unlock()
	require.Equal(t, 1, overFails)
	require.Equal(t, 1, overSkip)
	planStep(t, a, budget, 1, 0)
	a.StepBoundary() // waits one boundary
	require.Zero(t, a.Stats()["step_plan_active"])
	planStep(t, a, budget, 1, 0)
	a.StepBoundary() // then tries again
	require.Equal(t, int64(1), a.Stats()["step_plan_active"])
	require.NoError(t, a.checkInvariants())
}

// TestStepPlanProperty repeats a random step with random perturbations
// (requests dropped, added or moved to another stream, frees on recorded
// streams left pending across boundaries, EmptyCache, a lower limit, the
// budget withdrawn or changed), with StepBoundary between steps, and checks
// after every operation the allocator's structures, that live blocks are
// disjoint and at least their rounded size, and the allocated bytes.
func TestStepPlanProperty(t *testing.T) {
	const budget = 768 << 20
	seeds := 6
	if testing.Short() || raceEnabled {
		seeds = 2
	}
	for seed := 1; seed <= seeds; seed++ {
		rng := rand.New(rand.NewSource(int64(seed)))
		slack := []float64{0.1, 0.3, 0.6}[seed%3]
		a, d := newTestAllocator(t, Config{Budget: budget, BudgetSlack: slack})
		type op struct {
			size  uint64
			freeN int // free the freeN-th live block instead (when > 0)
		}
		var base []op
		for i := 0; i < 250; i++ {
			if i > 0 && rng.Intn(3) == 0 {
				base = append(base, op{freeN: 1 + rng.Intn(8)})
				continue
			}
			size := uint64(1+rng.Intn(48)) << 20
			if rng.Intn(4) == 0 {
				size = uint64(1+rng.Intn(1000)) << 10
			}
			base = append(base, op{size: size})
		}
		type live struct {
			p    device.Ptr
			size uint64
		}
		var lives []live
		var allocated uint64
		check := func(step, i int) {
			require.NoError(t, a.checkInvariants(), "seed %d step %d op %d", seed, step, i)
			sorted := slices.Clone(lives)
			slices.SortFunc(sorted, func(x, y live) int { return int(int64(x.p) - int64(y.p)) })
			for j := 1; j < len(sorted); j++ {
				require.LessOrEqual(t, uint64(sorted[j-1].p)+a.blockSize(sorted[j-1].p), uint64(sorted[j].p), "seed %d step %d op %d: overlap", seed, step, i)
			}
			require.Equal(t, allocated, a.Allocated(), "seed %d step %d op %d", seed, step, i)
		}
		busy := false
		for step := 0; step < 14; step++ {
			a.StepBoundary()
			if busy {
				d.SetStreamBusy(9, false)
				busy = false
			}
			switch step {
			case 6:
				a.SetBudget(0) // no budget: plans retire
			case 7:
				a.SetBudget(budget)
			case 10:
				// A limit (the fake device's busy stream blocks the
				// synchronization that would make memory freed on other
				// streams reusable, so no busy stream from here on).
				require.NoError(t, a.SetLimit(uint64(float64(budget)*(1+slack))+256<<20))
			}
			for i, o := range base {
				if rng.Intn(20) == 0 {
					continue // dropped this step
				}
				if o.freeN > 0 {
					if len(lives) == 0 {
						continue
					}
					j := (o.freeN * 7) % len(lives)
					x := lives[j]
					if rng.Intn(15) == 0 && !busy && step < 9 {
						require.NoError(t, a.RecordStream(x.p, 9))
						d.SetStreamBusy(9, true)
						busy = true
					}
					allocated -= a.blockSize(x.p)
					require.NoError(t, a.Free(x.p))
					lives = slices.Delete(lives, j, j+1)
				} else {
					s := device.Stream(1)
					if rng.Intn(10) == 0 {
						s = 2
					}
					size := o.size
					if rng.Intn(25) == 0 {
						size = uint64(1+rng.Intn(48)) << 20 // another request
					}
					var used uint64
					for _, x := range lives {
						used += x.size
					}
					for used+size > budget && len(lives) > 0 { // the engine evicts to stay at the budget
						x := lives[0]
						allocated -= a.blockSize(x.p)
						require.NoError(t, a.Free(x.p))
						used -= x.size
						lives = lives[1:]
					}
					p, err := a.Malloc(size, s)
					require.NoError(t, err)
					require.GreaterOrEqual(t, a.blockSize(p), roundSize(size))
					allocated += a.blockSize(p)
					lives = append(lives, live{p, size})
				}
				if i%25 == 0 {
					check(step, i)
				}
			}
			if step == 4 && !busy {
				require.NoError(t, a.EmptyCache())
			}
			keep := rng.Intn(4) // a few blocks live across the boundary
			for len(lives) > keep {
				x := lives[len(lives)-1]
				allocated -= a.blockSize(x.p)
				require.NoError(t, a.Free(x.p))
				lives = lives[:len(lives)-1]
			}
			check(step, -1)
		}
		for _, x := range lives {
			require.NoError(t, a.Free(x.p))
		}
		d.SetStreamBusy(9, false)
		require.NoError(t, a.EmptyCache())
		require.NoError(t, a.checkInvariants())
		st := a.Stats()
		require.Zero(t, st["allocated_bytes.all.current"])
		require.Zero(t, st["reserved_bytes.all.current"])
		if testing.Verbose() {
			t.Logf("seed %d slack %.1f: %d plans (%d reused), %d placed, %d missed, %d remapped", seed, slack,
				st["num_step_plans"], st["num_step_plans_reused"], st["num_step_plan_placed"], st["num_step_plan_missed"], st["num_remap"])
		}
	}
}

// TestStepPlanKeptThroughSmallChanges: a step that differs from its plan in
// one request (an engine whose choices vary a little) keeps the plan, and
// the steps after it remap nothing.
func TestStepPlanKeptThroughSmallChanges(t *testing.T) {
	const budget = 1 << 30
	a, _ := newTestAllocator(t, Config{Budget: budget, BudgetSlack: 0.4})
	var prev Stats
	for step := 0; step < 8; step++ {
		a.StepBoundary()
		vary := -1
		if step >= 3 {
			vary = 10 + 40*(step-3) // one large request differs, a different one each step
		}
		planStepVary(t, a, budget, 1, 0, vary)
		require.NoError(t, a.checkInvariants())
		st := a.Stats()
		t.Logf("step %d: placed %d missed %d plans %d remaps %d", step+1, st["num_step_plan_placed"]-prev["num_step_plan_placed"], st["num_step_plan_missed"]-prev["num_step_plan_missed"], st["num_step_plans"], st["num_remap"]-prev["num_remap"])
		if step >= 4 {
			require.Equal(t, int64(1), st["num_step_plans"], "step %d: the plan is kept", step+1)
			require.LessOrEqual(t, st["num_step_plan_missed"]-prev["num_step_plan_missed"], int64(3), "step %d", step+1)
		}
		prev = st
	}
	require.Positive(t, prev["num_step_plans_reused"])
}

// TestStepPlanSearchRestarts: the churn of TestStepPlanOverBound, whose
// plan the search's first rounds leave over the bound, fits it with the
// search's restarts (noisy blame): from the third step on nothing is
// remapped and reserved memory stays within the bound (the plan segment's
// memory beyond the plan is returned at the boundary).
func TestStepPlanSearchRestarts(t *testing.T) {
	const budget = 1 << 30
	a, _ := newTestAllocator(t, Config{Budget: budget, BudgetSlack: 0.2})
	bound := a.planBound(budget)
	prev := a.Stats()
	for step := 0; step < 5; step++ {
		a.StepBoundary()
		a.ResetPeakStats()
		planStep(t, a, budget, 1, 0)
		require.NoError(t, a.checkInvariants())
		st := a.Stats()
		if step >= 2 {
			require.Zero(t, st["num_remap"]-prev["num_remap"], "step %d remaps nothing", step+1)
			require.LessOrEqual(t, uint64(st["reserved_bytes.all.peak"]), bound, "step %d: reserved within the bound", step+1)
		}
		prev = st
	}
	require.Equal(t, int64(1), prev["step_plan_active"])
	require.LessOrEqual(t, uint64(prev["step_plan_need_bytes"]), bound, "the plan fits the bound")
}
