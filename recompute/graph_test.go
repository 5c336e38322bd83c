package recompute

import (
	"errors"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fresh(size uint64) OutSpec { return OutSpec{Size: size, Alias: -1} }

func mustOp(t testing.TB, g *Graph, name string, ins []TensorID, outs ...OutSpec) OpID {
	t.Helper()
	op, err := g.AddOp(name, ins, outs, 10, 0, 0)
	require.NoError(t, err)
	return op
}

func out(g *Graph, op OpID, i int) TensorID { return g.Op(op).Outputs[i] }

func TestAddOpStoragesAndEdges(t *testing.T) {
	g := NewGraph()
	x, err0 := g.AddExternal(100, 1)
	require.NoError(t, err0)
	op := mustOp(t, g, "f", []TensorID{x, x}, fresh(40), OutSpec{Size: 999, Alias: 1})
	a, v := out(g, op, 0), out(g, op, 1)

	xs := g.StorageOf(x)
	assert.True(t, xs.NoRecompute, "external tensors have no lineage")
	assert.Equal(t, g.Tensor(x).Storage, g.Tensor(v).Storage, "a view shares its input's storage")
	assert.Equal(t, []TensorID{x, v}, g.StorageTensors(g.Tensor(x).Storage, nil))
	assert.Equal(t, int32(2), xs.Refs)
	assert.Equal(t, int64(10), xs.Compute, "the view op's cost is part of rebuilding the storage")
	as := g.StorageOf(a)
	assert.Equal(t, uint64(40), as.Size)
	assert.Equal(t, int64(10), as.Compute)
	// one edge x -> a per op, none from x to itself
	assert.Equal(t, []StorageID{g.Tensor(a).Storage}, xs.Children)
	assert.Equal(t, []StorageID{g.Tensor(x).Storage}, as.Parents)
	assert.Equal(t, int32(1), xs.LiveChildren)
	assert.Equal(t, uint64(40), g.FreshSize(op))
}

func TestAddOpRejects(t *testing.T) {
	g := NewGraph()
	x, err0 := g.AddExternal(8, 1)
	require.NoError(t, err0)
	tests := []struct {
		name string
		ins  []TensorID
		outs []OutSpec
		cost int64
		want string
	}{
		{"unknown input", []TensorID{7}, nil, 1, "unknown tensor"},
		{"alias out of range", []TensorID{x}, []OutSpec{{Alias: 1}}, 1, "alias 1 out of range"},
		{"negative cost", []TensorID{x}, nil, -1, "negative cost"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := g.AddOp("f", tc.ins, tc.outs, tc.cost, 0, 0)
			require.ErrorContains(t, err, tc.want)
		})
	}
	op := mustOp(t, g, "f", []TensorID{x}, fresh(8))
	g.Drop(g.Tensor(out(g, op, 0)).Storage)
	_, err := g.AddOp("g", []TensorID{out(g, op, 0)}, nil, 1, 0, 0)
	require.ErrorContains(t, err, "is not resident")
}

func TestRerunDefinesOutputsAndCountsDuplicates(t *testing.T) {
	g := NewGraph()
	x, err0 := g.AddExternal(8, 1)
	require.NoError(t, err0)
	op := mustOp(t, g, "bn", []TensorID{x}, fresh(100), fresh(30), OutSpec{Alias: 0})
	a, b, v := out(g, op, 0), out(g, op, 1), out(g, op, 2)
	g.Drop(g.Tensor(a).Storage)
	assert.False(t, g.IsResident(a))
	assert.True(t, g.IsResident(b))
	newly, dup, err := g.Rerun(op, nil)
	require.NoError(t, err)
	assert.Equal(t, []StorageID{g.Tensor(a).Storage}, newly)
	assert.Equal(t, uint64(30), dup, "b was resident: the re-run's copy of it is thrown away")
	for _, x := range []TensorID{a, b, v} {
		assert.True(t, g.IsResident(x))
	}
	// inputs must be resident
	op2 := mustOp(t, g, "g", []TensorID{a}, fresh(1))
	g.Drop(g.Tensor(a).Storage)
	_, _, err = g.Rerun(op2, nil)
	require.ErrorContains(t, err, "is not resident")
}

func TestRerunWithAReleasedOutputThrowsItAway(t *testing.T) {
	g := NewGraph()
	x, err0 := g.AddExternal(8, 1)
	require.NoError(t, err0)
	op := mustOp(t, g, "topk", []TensorID{x}, fresh(100), fresh(30))
	vals, idx := out(g, op, 0), out(g, op, 1)
	g.Release(g.Tensor(vals).Storage) // the program dropped vals; nothing needs it
	g.Drop(g.Tensor(idx).Storage)
	steps, err := g.Plan(idx, nil)
	require.NoError(t, err)
	assert.Equal(t, stepsOf(op), steps)
	newly, dup, err := g.Rerun(op, nil)
	require.NoError(t, err, "a released sibling does not stop the re-run")
	assert.Equal(t, []StorageID{g.Tensor(idx).Storage}, newly)
	assert.Equal(t, uint64(100), dup, "the re-run's copy of the released output is thrown away")
	assert.True(t, g.IsResident(idx))
	assert.False(t, g.IsResident(vals))
	assert.Equal(t, Released, g.StorageOf(vals).State)
}

func stepsOf(ops ...OpID) []Step {
	s := make([]Step, len(ops))
	for i, o := range ops {
		s[i] = Step{Kind: StepRerun, Op: o}
	}
	return s
}

func TestPlan(t *testing.T) {
	g := NewGraph()
	x, err0 := g.AddExternal(8, 1)
	require.NoError(t, err0)
	f1 := mustOp(t, g, "f1", []TensorID{x}, fresh(10))
	a := out(g, f1, 0)
	f2 := mustOp(t, g, "f2", []TensorID{a}, fresh(10), fresh(10)) // two outputs
	b, c := out(g, f2, 0), out(g, f2, 1)
	f3 := mustOp(t, g, "f3", []TensorID{b, c, a}, fresh(10))
	d := out(g, f3, 0)
	fv := mustOp(t, g, "view", []TensorID{d}, OutSpec{Alias: 0})
	v := out(g, fv, 0)

	steps, err := g.Plan(d, nil)
	require.NoError(t, err)
	assert.Empty(t, steps, "resident")

	for _, s := range []TensorID{a, b, d} {
		g.Drop(g.Tensor(s).Storage)
	}
	steps, err = g.Plan(d, nil)
	require.NoError(t, err)
	// a first (needed by f2 and f3), f2 once for both b and c, then f3
	assert.Equal(t, stepsOf(f1, f2, f3), steps)

	// the view needs its base back, then its own op
	steps, err = g.Plan(v, nil)
	require.NoError(t, err)
	assert.Equal(t, stepsOf(f1, f2, f3, fv), steps)

	// the plan does not change the graph
	assert.False(t, g.IsResident(a))

	// a swapped input is brought back by a copy
	g.SwapOut(g.Tensor(x).Storage)
	steps, err = g.Plan(a, nil)
	require.NoError(t, err)
	assert.Equal(t, []Step{{Kind: StepSwapIn, Tensor: x}, {Kind: StepRerun, Op: f1}}, steps)
	g.SwapIn(g.Tensor(x).Storage)
}

func TestPlanErrors(t *testing.T) {
	g := NewGraph()
	x, err0 := g.AddExternal(8, 1)
	require.NoError(t, err0)
	f1 := mustOp(t, g, "f1", []TensorID{x}, fresh(10))
	a := out(g, f1, 0)
	rng, err := g.AddOp("dropout", []TensorID{a}, []OutSpec{fresh(10)}, 5, NoRecompute, 0)
	require.NoError(t, err)
	r := out(g, rng, 0)
	f2 := mustOp(t, g, "f2", []TensorID{r}, fresh(10))
	b := out(g, f2, 0)

	g.Drop(g.Tensor(x).Storage)
	g.Drop(g.Tensor(a).Storage)
	_, err = g.Plan(a, nil)
	require.ErrorIs(t, err, ErrNotRecomputable)
	assert.ErrorContains(t, err, "external tensor that was dropped")

	g.Drop(g.Tensor(r).Storage)
	g.Drop(g.Tensor(b).Storage)
	_, err = g.Plan(b, nil)
	require.ErrorIs(t, err, ErrNotRecomputable)
	assert.ErrorContains(t, err, "dropout")

	g.Release(g.Tensor(b).Storage)
	_, err = g.Plan(b, nil)
	assert.ErrorContains(t, err, "released")
	_, err = g.Plan(99, nil)
	assert.True(t, errors.Is(err, ErrUnknownTensor))
}

// TestPlanDeepChain plans through a chain of 100,000 evicted ops with the
// goroutine stack capped at 256 KiB: a recursive planner would need
// megabytes and crash.
func TestPlanDeepChain(t *testing.T) {
	const n = 100_000
	g := NewGraph()
	prev, err0 := g.AddExternal(8, 1)
	require.NoError(t, err0)
	ops := make([]OpID, n)
	for i := range ops {
		ops[i] = mustOp(t, g, "f", []TensorID{prev}, fresh(8))
		prev = out(g, ops[i], 0)
	}
	for _, o := range ops {
		g.Drop(g.Tensor(out(g, o, 0)).Storage)
	}
	old := debug.SetMaxStack(256 << 10)
	defer debug.SetMaxStack(old)
	done := make(chan []Step)
	go func() {
		steps, err := g.Plan(prev, nil)
		if err != nil {
			panic(err)
		}
		done <- steps
	}()
	steps := <-done
	require.Len(t, steps, n)
	assert.Equal(t, ops[0], steps[0].Op, "the oldest ancestor first")
	assert.Equal(t, ops[n-1], steps[n-1].Op)
}

func TestClasses(t *testing.T) {
	var c Classes
	a, b, d := c.New(1), c.New(2), c.New(4)
	assert.Equal(t, int64(1), c.Cost(a))
	r := c.Union(a, b)
	assert.Equal(t, r, c.Find(a))
	assert.Equal(t, int64(3), c.Cost(b))
	assert.Equal(t, r, c.Union(b, a), "merging a class with itself changes nothing")
	assert.Equal(t, int64(3), c.Cost(a))
	c.Union(d, a)
	assert.Equal(t, int64(7), c.Cost(d))
	c.Add(b, -2)
	assert.Equal(t, int64(5), c.Cost(a))
	assert.Equal(t, 3, c.Len())
}

// TestReserve: after Reserve, issuing that many ops, tensors and storages
// does not grow the graph's arrays (no copies), and the graph is unchanged.
func TestReserve(t *testing.T) {
	const n = 100
	g := NewGraph()
	g.Reserve(n+1, n+1, n+1)
	g.Reserve(0, -1, 0) // nothing
	caps := func() [4]int { return [4]int{cap(g.ops), cap(g.opStamp), cap(g.tensors), cap(g.storages)} }
	before := caps()
	x, err0 := g.AddExternal(100, 1)
	require.NoError(t, err0)
	for range n {
		x = out(g, mustOp(t, g, "f", []TensorID{x}, fresh(100)), 0)
	}
	assert.Equal(t, before, caps(), "no array grew")
	assert.Equal(t, n, g.NumOps())
	assert.Equal(t, n+1, g.NumTensors())
	assert.Equal(t, n+1, g.NumStorages())
}
