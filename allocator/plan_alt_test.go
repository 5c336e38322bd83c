package allocator

import (
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"
)

// altStep runs one step of n requests drawn from seed at about budget bytes
// live (an engine at its budget: the oldest blocks go first), everything
// freed at the end.
func altStep(t *testing.T, a *Allocator, budget uint64, seed int64, n int) {
	t.Helper()
	altStepCommon(t, a, budget, seed, n, 0)
}

// altStepCommon is altStep whose first common requests are the same for
// every seed (two steps that begin alike: a GAN's two steps both start with
// the generator's forward).
func altStepCommon(t *testing.T, a *Allocator, budget uint64, seed int64, n, common int) {
	t.Helper()
	rng := rand.New(rand.NewSource(-1))
	var live liveAtBudget
	for i := 0; i < n; i++ {
		if i == common {
			rng = rand.New(rand.NewSource(seed))
		}
		size := uint64(4+rng.Intn(40)) << 20
		if i%6 == 5 {
			size = uint64(1+rng.Intn(900)) << 10 // small pool
		}
		live.alloc(t, a, budget, size, size, func(n int) int { return rng.Intn(n) })
	}
	require.NoError(t, a.checkInvariants())
	freeAll(t, a, live.ptrs)
}

// altRun runs the steps of seeds in turn (seeds[step % len(seeds)]),
// with or without a boundary before each, and returns the granules
// remapped, the requests placed and missed by the plans per step.
func altRun(t *testing.T, budget uint64, seeds []int64, steps, n int, boundaries bool) (remap, placed, missed []int64) {
	return altRunCommon(t, budget, seeds, steps, n, 0, boundaries)
}

// altRunCommon is altRun with steps whose first common requests are alike.
func altRunCommon(t *testing.T, budget uint64, seeds []int64, steps, n, common int, boundaries bool) (remap, placed, missed []int64) {
	a, _ := newTestAllocator(t, Config{Budget: budget})
	prev := a.Stats()
	for step := 0; step < steps; step++ {
		if boundaries {
			a.StepBoundary()
		}
		altStepCommon(t, a, budget, seeds[step%len(seeds)], n, common)
		st := a.Stats()
		remap = append(remap, st["num_remap"]-prev["num_remap"])
		placed = append(placed, st["num_step_plan_placed"]-prev["num_step_plan_placed"])
		missed = append(missed, st["num_step_plan_missed"]-prev["num_step_plan_missed"])
		prev = st
	}
	return
}

func sum64(x []int64) (s int64) {
	for _, v := range x {
		s += v
	}
	return s
}

// TestStepPlanAlternating: steps of different kinds in turn (a GAN's
// discriminator and generator steps, each ending at a boundary; three
// kinds; two kinds that begin alike; gradient accumulation with an
// evaluation step; all with plans that fit the bound) remap no more with
// step boundaries than without, every large request is placed by a plan
// once each kind has been seen twice, and the steady steps remap at most a
// quarter of best fit's (most remap nothing). Before the plan library each
// boundary made a plan of the other kind: 2,852 granules remapped over 12
// steps of the first case against 918 without boundaries (the sizes were
// 4-63 MiB then).
func TestStepPlanAlternating(t *testing.T) {
	const budget = 600 << 20
	const steps = 20
	for _, c := range []struct {
		seeds  []int64
		common int
	}{
		{[]int64{11, 12}, 0},
		{[]int64{21, 22}, 0},
		{[]int64{31, 32, 33}, 0},
		{[]int64{62, 63}, 10}, // alike for their first 10 requests
		{[]int64{66, 67}, 10},
		{[]int64{72, 73}, 6},
		{[]int64{51, 51, 51, 52}, 0}, // three accumulation steps, an evaluation
	} {
		plain, _, _ := altRunCommon(t, budget, c.seeds, steps, 60, c.common, false)
		planned, placed, missed := altRunCommon(t, budget, c.seeds, steps, 60, c.common, true)
		t.Logf("seeds %v (alike %d): remapped per step without boundaries %v (%d), with %v (%d); placed %v missed %v",
			c.seeds, c.common, plain, sum64(plain), planned, sum64(planned), placed, missed)
		require.LessOrEqual(t, sum64(planned), sum64(plain), "seeds %v: boundaries remap no more than best fit", c.seeds)
		// From the fifth step on (the second round of a kind that comes
		// every fourth step: the step after its second occurrence).
		for i := max(4, 2*len(c.seeds)); i < steps; i++ {
			require.Zero(t, missed[i], "seeds %v step %d: every large request placed", c.seeds, i+1)
			require.Positive(t, placed[i], "seeds %v step %d: a plan in force", c.seeds, i+1)
		}
		require.LessOrEqual(t, 4*sum64(planned[8:]), sum64(plain[8:]), "seeds %v: steady steps remap a quarter of best fit at most", c.seeds)
	}
}

// TestStepPlanVarying: steps that never repeat (each a new kind: data-
// dependent shapes), and more kinds in turn than the library keeps, remap
// no more with boundaries than without.
func TestStepPlanVarying(t *testing.T) {
	const budget = 600 << 20
	const steps = 12
	var fresh []int64
	for i := int64(0); i < steps; i++ {
		fresh = append(fresh, 100+i)
	}
	for _, seeds := range [][]int64{fresh, {61, 62, 63, 64, 65}} {
		plain, _, _ := altRun(t, budget, seeds, steps, 60, false)
		planned, placed, missed := altRun(t, budget, seeds, steps, 60, true)
		t.Logf("seeds %v: remapped per step without boundaries %v (%d), with %v (%d); placed %v missed %v",
			seeds, plain, sum64(plain), planned, sum64(planned), placed, missed)
		require.LessOrEqual(t, sum64(planned), sum64(plain), "seeds %v: boundaries remap no more than best fit", seeds)
	}
}
