package evict

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	rc "github.com/memscale/memscale/recompute"
)

// abiDriver drives an Engine the way the Python DTR region drives it through
// the C ABI: before an op, lock its resident inputs and rebuild the missing
// ones with Plan + HoldPlan + Rematerialized (a step input evicted since the
// plan was made is rebuilt by a nested plan first), make room for the fresh
// outputs by lowering the budget for one Evict loop (memscale_dtr_set_budget,
// memscale_dtr_evict until it returns 0), record the op (Call), unlock, and
// hand out what releases freed. It counts how many resident storages are
// locked at the worst moment.
type abiDriver struct {
	t         *testing.T
	e         *Engine
	budget    uint64
	buf       [8]Victim
	maxLocked int // most resident storages locked at once
	maxNest   int // deepest plan nesting
	nest      int
}

// evictLoop calls Evict until it returns 0, as the plugin does; false when
// it fails (nothing evictable).
func (d *abiDriver) evictLoop() error {
	for {
		n, err := d.e.Evict(0, d.buf[:])
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
	}
}

// reserve makes room for extra bytes under the budget.
func (d *abiDriver) reserve(extra uint64) error {
	d.noteLocks()
	if d.budget == 0 || extra == 0 {
		return d.evictLoop()
	}
	require.Less(d.t, extra, d.budget, "an op's outputs alone exceed the budget")
	d.e.SetBudget(d.budget - extra)
	defer d.e.SetBudget(d.budget)
	return d.evictLoop()
}

func (d *abiDriver) noteLocks() {
	g := d.e.Graph()
	n := 0
	for s := 0; s < g.NumStorages(); s++ {
		if st := g.Storage(rc.StorageID(s)); st.State == rc.Resident && st.Locks > 0 {
			n++
		}
	}
	d.maxLocked = max(d.maxLocked, n)
}

// materialize makes t resident with the engine's plan (memscale_dtr_plan,
// which commits it), running its steps in order.
func (d *abiDriver) materialize(t rc.TensorID) error {
	e := d.e
	g := e.Graph()
	steps, err := e.Plan(t, nil)
	if err != nil {
		return err
	}
	if err := e.HoldPlan(steps); err != nil {
		return err
	}
	d.nest++
	d.maxNest = max(d.maxNest, d.nest)
	defer func() { d.nest-- }()
	for _, st := range steps {
		require.Equal(d.t, rc.StepRerun, st.Kind, "nothing is swapped in this test")
		for _, in := range g.Op(st.Op).Inputs {
			if !g.IsResident(in) {
				// taken by the budget loop since the plan was made; the
				// plan's hold keeps it once it is back
				if err := d.materialize(in); err != nil {
					return err
				}
			}
		}
		if err := d.reserve(g.FreshSize(st.Op)); err != nil {
			return fmt.Errorf("rebuilding tensor %d, step op %d (%s): %w", t, st.Op, g.Op(st.Op).Name, err)
		}
		if err := e.Rematerialized(st.Op, g.Op(st.Op).Cost); err != nil {
			return err
		}
	}
	if !g.IsResident(t) {
		return fmt.Errorf("tensor %d not resident after its plan", t)
	}
	return nil
}

// op runs one op: inputs made resident and locked, room made, recorded.
func (d *abiDriver) op(name string, ins []rc.TensorID, sizes []uint64, cost int64) ([]rc.TensorID, error) {
	e := d.e
	g := e.Graph()
	for _, in := range ins {
		if err := e.Access(in); err != nil {
			return nil, err
		}
	}
	var locked []rc.TensorID
	defer func() {
		for _, in := range locked {
			require.NoError(d.t, e.Unlock(in))
		}
	}()
	for _, in := range ins {
		if g.IsResident(in) {
			require.NoError(d.t, e.Lock(in))
			locked = append(locked, in)
		}
	}
	for _, in := range ins {
		if !g.IsResident(in) {
			if err := d.materialize(in); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			require.NoError(d.t, e.Lock(in))
			locked = append(locked, in)
		}
	}
	outs := make([]Output, len(sizes))
	var fresh uint64
	for i, s := range sizes {
		outs[i] = Output{Size: s, Alias: -1}
		fresh += s
	}
	if err := d.reserve(fresh); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	_, ids, err := e.Call(name, ins, outs, cost, 0)
	return ids, err
}

func (d *abiDriver) release(ts ...rc.TensorID) error {
	for _, t := range ts {
		require.NoError(d.t, d.e.Release(t))
	}
	return d.evictLoop()
}

// trainStep runs one training step of a depth-layer MLP the way autograd
// does: forward z_i = linear(a_{i-1}, w_i) (released once a_i = act(z_i)
// exists; the activation's backward reads its output), the loss, then
// backward d_i = act_grad(g_i, a_i), g_{i-1} = mm(d_i, w_i), the weight
// gradient wg_i = mm(d_i, a_{i-1}) (pinned as soon as it exists, like the
// plugin's gradient hook does), each intermediate released when its last
// reader ran.
func trainStep(t *testing.T, d *abiDriver, depth int, act uint64) error {
	const small = 16
	e := d.e
	x := e.NewTensor(act, true)
	ws := make([]rc.TensorID, depth+1)
	for i := 1; i <= depth; i++ {
		ws[i] = e.NewTensor(small, true)
	}
	a := make([]rc.TensorID, depth+1)
	a[0] = x
	one := func(name string, ins []rc.TensorID, size uint64, cost int64) (rc.TensorID, error) {
		ids, err := d.op(name, ins, []uint64{size}, cost)
		if err != nil {
			return 0, err
		}
		return ids[0], nil
	}
	for i := 1; i <= depth; i++ {
		z, err := one(fmt.Sprintf("linear%d", i), []rc.TensorID{a[i-1], ws[i]}, act, 1000+int64(i))
		if err != nil {
			return err
		}
		if a[i], err = one(fmt.Sprintf("act%d", i), []rc.TensorID{z}, act, 200); err != nil {
			return err
		}
		if err := d.release(z); err != nil {
			return err
		}
	}
	loss, err := one("loss", []rc.TensorID{a[depth]}, small, 100)
	if err != nil {
		return err
	}
	g, err := one("loss_grad", []rc.TensorID{loss, a[depth]}, act, 300)
	if err != nil {
		return err
	}
	for i := depth; i >= 1; i-- {
		di, err := one(fmt.Sprintf("act_grad%d", i), []rc.TensorID{g, a[i]}, act, 300)
		if err != nil {
			return err
		}
		if err := d.release(g); err != nil {
			return err
		}
		if i < depth || depth == 1 {
			if err := d.release(a[i]); err != nil {
				return err
			}
		}
		if i > 1 {
			if g, err = one(fmt.Sprintf("grad_in%d", i), []rc.TensorID{di, ws[i]}, act, 2000); err != nil {
				return err
			}
		}
		wg, err := one(fmt.Sprintf("grad_w%d", i), []rc.TensorID{di, a[i-1]}, small, 2000)
		if err != nil {
			return err
		}
		require.NoError(t, e.Pin(wg))
		if err := d.release(di); err != nil {
			return err
		}
	}
	return d.release(a[depth], loss)
}

// TestDeepChainUnderBudget is the regression test for rematerialization in
// a deep backward pass: a 16- and a 64-layer MLP step under 50 % and 30 % of
// its peak, driven through the calls the C ABI makes. It used to fail with
// "nothing evictable" and O(depth) storages locked: a plan held the inputs
// of all its steps until each was reported, and the plans were as long as
// the whole forward and backward pass, because a gradient whose parent was
// resident looked cheap, was evicted, and then lost that parent when the
// program released it.
func TestDeepChainUnderBudget(t *testing.T) {
	const act = 1000
	for _, depth := range []int{16, 64} {
		base := &abiDriver{t: t, e: newEngine(t, Config{})}
		require.NoError(t, trainStep(t, base, depth, act))
		peak := base.e.Stats().PeakUsage
		baseCost := base.e.Stats().BaseCostNS
		for _, frac := range []float64{0.5, 0.3} {
			budget := uint64(frac * float64(peak))
			for _, keep := range []bool{true, false} {
				t.Run(fmt.Sprintf("depth%d/%.0f%%/keep=%v", depth, frac*100, keep), func(t *testing.T) {
					e := newEngine(t, Config{Budget: budget, DropNeededReleased: !keep})
					d := &abiDriver{t: t, e: e, budget: budget}
					require.NoError(t, trainStep(t, d, depth, act))
					st := e.Stats()
					overhead := float64(st.BaseCostNS+st.RematCostNS) / float64(baseCost)
					t.Logf("peak %d of budget %d (baseline peak %d): %d rematerializations, overhead x%.2f, "+
						"at most %d storages locked, plans nested %d deep",
						st.PeakUsage, budget, peak, st.Rematerializations, overhead, d.maxLocked, d.maxNest)
					assert.LessOrEqual(t, st.PeakUsage, budget)
					assert.Positive(t, st.Rematerializations)
					assert.Zero(t, e.PlanHolds(), "every plan's hold was released")
					g := e.Graph()
					for s := 0; s < g.NumStorages(); s++ {
						assert.Zero(t, g.Storage(rc.StorageID(s)).Locks, "storage %d still locked", s)
					}
					// An op's inputs, its nested rebuilds' inputs and the
					// pinned inputs: a handful, whatever the depth.
					assert.LessOrEqual(t, d.maxLocked, 8, "locked storages must not grow with depth")
					if keep {
						assert.Less(t, overhead, 2.5, "the backward pass must not rebuild whole gradient chains")
					}
				})
			}
		}
	}
}

// TestNothingEvictableSaysWhy: the error of an impossible budget counts the
// resident storages by what keeps them (the old message counted every
// storage that was not a candidate, evicted ones included).
func TestNothingEvictableSaysWhy(t *testing.T) {
	e := newEngine(t, Config{Budget: 1 << 20, EvicteeMinSize: 10})
	x := e.NewTensor(100, true)
	_, ys, err := e.Call("f", []rc.TensorID{x}, []Output{{Size: 300, Alias: -1}, {Size: 5, Alias: -1}}, 10, 0)
	require.NoError(t, err)
	_, zs, err := e.Call("g", []rc.TensorID{ys[0]}, []Output{{Size: 200, Alias: -1}}, 10, 0)
	require.NoError(t, err)
	// z is evicted and rebuilt by a plan whose step holds y
	var buf [4]Victim
	e.SetBudget(400)
	require.NoError(t, e.Lock(ys[0]))
	n, err := e.Evict(0, buf[:])
	require.NoError(t, err)
	require.NoError(t, e.Unlock(ys[0]))
	require.Equal(t, 1, n)
	require.Equal(t, zs[0], buf[0].Tensor)
	steps, err := e.Plan(zs[0], nil)
	require.NoError(t, err)
	require.NoError(t, e.HoldPlan(steps))
	e.SetBudget(10)
	_, err = e.Evict(0, buf[:])
	require.ErrorIs(t, err, ErrNoEvictable)
	assert.ErrorContains(t, err, "3 resident storages, 405 bytes: 1 pinned, 1 locked (300 bytes; 1 of them inputs of the next step of 1 unfinished rematerialization plans), 1 under the minimum evictee size, 0 not recomputable")
	require.NoError(t, e.Rematerialized(steps[0].Op, -1))
	assert.Zero(t, e.PlanHolds())
}
