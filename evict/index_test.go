package evict

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"

	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/require"
)

// twin drives an engine using the index and one using the exact scan through
// the same random history and fails as soon as they choose different
// victims.
type twin struct {
	t    *testing.T
	rng  *rand.Rand
	idx  *Engine
	scan *Engine
	live []rc.TensorID // tensors holding references (one entry per reference)
	// log: the last twinLogLen operations, formatted only when a check fails
	// (fail): a history is hundreds of thousands of them in the soak.
	log  [twinLogLen]twinOp
	nlog int
	// abandoned is set when a plan run was given up (AbandonPlans): the
	// history ends there, as a failed rebuild ends the program's step.
	abandoned bool
	// budgetAt > 0: the history starts with no budget in reach (nothing is
	// evicted, so the lazy index stays a set) and budget is set at that
	// step; the first pick then builds the index from a long history.
	budgetAt int
	budget   uint64
}

const twinLogLen = 30

// twinOp is an operation of the log: what, with arg when hasArg, or an
// eviction's request, victims and error.
type twinOp struct {
	what    string
	arg     int64
	hasArg  bool
	evict   bool
	extra   uint64
	victims [4]Victim
	n       int
	err     error
}

func (o twinOp) String() string {
	switch {
	case o.evict:
		return fmt.Sprintf("evict(%d) -> %v %v", o.extra, o.victims[:max(o.n, 0)], o.err)
	case o.hasArg:
		return fmt.Sprintf("%s %d", o.what, o.arg)
	}
	return o.what
}

func (w *twin) record(o twinOp) {
	w.log[w.nlog%twinLogLen] = o
	w.nlog++
}

func newTwin(t *testing.T, seed int64) *twin {
	rng := rand.New(rand.NewSource(seed))
	hs := Heuristics()
	cfg := Config{
		Heuristic:       hs[rng.Intn(len(hs))],
		Budget:          uint64(2000 + rng.Intn(6000)),
		SimulatorCompat: rng.Intn(3) == 0,
	}
	if rng.Intn(4) == 0 {
		cfg.RecompTimeFactor = 0.5 + rng.Float64()*2
		cfg.RecompMemoryFactor = 0.5 + rng.Float64()*2
	}
	if rng.Intn(4) == 0 {
		cfg.EvicteeMinSize = uint64(rng.Intn(200))
	}
	cfg.DropNeededReleased = rng.Intn(2) == 0
	budgetAt := 0
	if rng.Intn(3) == 0 {
		budgetAt = 50 + rng.Intn(250)
	}
	budget := cfg.Budget
	if budgetAt > 0 {
		cfg.Budget = 1 << 40
	}
	a, err := New(cfg)
	require.NoError(t, err)
	cfg.ExactScan = true
	b, err := New(cfg)
	require.NoError(t, err)
	return &twin{t: t, rng: rng, idx: a, scan: b, budgetAt: budgetAt, budget: budget}
}

func (w *twin) fail(format string, args ...any) {
	w.t.Helper()
	var last []string
	for i := max(0, w.nlog-twinLogLen); i < w.nlog; i++ {
		last = append(last, w.log[i%twinLogLen].String())
	}
	w.t.Fatalf("%s\nheuristic %s compat %v keep-needed %v; last operations:\n%v", fmt.Sprintf(format, args...),
		w.idx.Heuristic(), w.idx.cfg.SimulatorCompat, w.idx.cfg.DropNeededReleased, last)
}

// both applies f to both engines and checks they agree on the error.
func (w *twin) both(what string, f func(e *Engine) error) {
	o := twinOp{what: what}
	w.record(o)
	if ea, eb := f(w.idx), f(w.scan); (ea == nil) != (eb == nil) {
		w.t.Helper() // here rather than on every call: it walks the stack
		w.fail("%s: index engine err=%v, scan engine err=%v", o, ea, eb)
	}
}

// bothArg is both for the operation "what arg".
func (w *twin) bothArg(what string, arg int64, f func(e *Engine) error) {
	o := twinOp{what: what, arg: arg, hasArg: true}
	w.record(o)
	if ea, eb := f(w.idx), f(w.scan); (ea == nil) != (eb == nil) {
		w.t.Helper()
		w.fail("%s: index engine err=%v, scan engine err=%v", o, ea, eb)
	}
}

func (w *twin) evict(extra uint64) bool {
	var va, vb [4]Victim
	for {
		na, ea := w.idx.Evict(extra, va[:])
		nb, eb := w.scan.Evict(extra, vb[:])
		w.record(twinOp{evict: true, extra: extra, victims: va, n: na, err: ea})
		if (ea == nil) != (eb == nil) || na != nb {
			w.fail("evict(%d): index %v (%v), scan %v (%v)", extra, va[:max(na, 0)], ea, vb[:max(nb, 0)], eb)
		}
		if ea != nil {
			return false
		}
		for i := 0; i < na; i++ {
			if va[i] != vb[i] {
				w.fail("evict(%d): victim %d differs: index %+v, scan %+v (clock %d)", extra, i, va[i], vb[i], w.idx.Clock())
			}
		}
		if na < len(va) {
			return true
		}
	}
}

// resident makes t resident through the plan API, as the C ABI does: the
// engine holds the inputs of the step about to run, and an input evicted
// since the plan was made is rebuilt first by a nested plan.
func (w *twin) resident(t rc.TensorID) bool {
	steps, err := w.idx.Plan(t, nil)
	steps2, err2 := w.scan.Plan(t, nil)
	if (err == nil) != (err2 == nil) || (steps == nil) != (steps2 == nil) || !slices.Equal(steps, steps2) { // require only on a mismatch: a stack walk a call
		require.Equal(w.t, err == nil, err2 == nil)
		require.Equal(w.t, steps, steps2)
	}
	if err != nil {
		return false
	}
	w.both("hold", func(e *Engine) error { return e.HoldPlan(steps) })
	for _, st := range steps {
		if w.rng.Intn(200) == 0 {
			// the caller gives up (a step failed): every open plan goes
			w.both("abandon plans", func(e *Engine) error { return e.AbandonPlans() })
			w.abandoned = true
			return false
		}
		g := w.idx.Graph()
		var need uint64
		if st.Kind == rc.StepRerun {
			for _, in := range g.Op(st.Op).Inputs {
				if !g.IsResident(in) && !w.resident(in) {
					return false
				}
			}
			need = g.FreshSize(st.Op)
		} else {
			if g.StorageOf(st.Tensor).State != rc.Swapped {
				continue
			}
			need = g.StorageOf(st.Tensor).Size
		}
		if !w.evict(need) {
			return false
		}
		if st.Kind == rc.StepRerun {
			w.bothArg("remat op", int64(st.Op), func(e *Engine) error {
				err := e.Rematerialized(st.Op, -1)
				require.NoError(w.t, err, "the plan's hold keeps the step's inputs")
				return err
			})
		} else {
			w.bothArg("swapin", int64(st.Tensor), func(e *Engine) error { return e.SwappedIn(st.Tensor) })
		}
	}
	return true
}

func (w *twin) step() bool {
	rng := w.rng
	switch op := rng.Intn(10); {
	case op == 0 || len(w.live) < 2:
		size := uint64(rng.Intn(400))
		pinned := rng.Intn(3) == 0
		if !w.evict(size) {
			return false
		}
		var id rc.TensorID
		w.both("new", func(e *Engine) error { id = e.NewTensor(size, pinned); return nil })
		w.live = append(w.live, id)
	case op <= 4:
		// an op on 1-3 live inputs
		n := 1 + rng.Intn(3)
		ins := make([]rc.TensorID, n)
		for i := range ins {
			ins[i] = w.live[rng.Intn(len(w.live))]
		}
		for _, in := range ins {
			w.both("access", func(e *Engine) error { return e.Access(in) })
		}
		for _, in := range ins {
			if !w.idx.Graph().IsResident(in) && !w.resident(in) {
				return false
			}
			w.both("lock", func(e *Engine) error { return e.Lock(in) })
		}
		outs := make([]Output, 1+rng.Intn(3))
		var fresh uint64
		for i := range outs {
			outs[i] = Output{Size: uint64(rng.Intn(500)), Alias: -1}
			if rng.Intn(4) == 0 {
				outs[i].Alias = int32(rng.Intn(n))
			} else {
				fresh += outs[i].Size
			}
		}
		if !w.evict(fresh) {
			return false
		}
		cost := int64(1 + rng.Intn(1000))
		var ids []rc.TensorID
		w.both("call", func(e *Engine) error {
			var err error
			_, ids, err = e.Call("op", ins, outs, cost, 0)
			return err
		})
		w.live = append(w.live, ids...)
		for _, in := range ins {
			w.both("unlock", func(e *Engine) error { return e.Unlock(in) })
		}
	case op <= 6:
		i := rng.Intn(len(w.live))
		t := w.live[i]
		w.live[i] = w.live[len(w.live)-1]
		w.live = w.live[:len(w.live)-1]
		w.bothArg("release", int64(t), func(e *Engine) error { return e.Release(t) })
		if !w.evict(0) {
			return false
		}
	case op == 7:
		t := w.live[rng.Intn(len(w.live))]
		w.both("retain", func(e *Engine) error { return e.Retain(t) })
		w.live = append(w.live, t)
	case op == 8:
		t := w.live[rng.Intn(len(w.live))]
		w.both("access", func(e *Engine) error { return e.Access(t) })
	default:
		// bring something back and tighten the budget a little
		t := w.live[rng.Intn(len(w.live))]
		if !w.idx.Graph().IsResident(t) && !w.resident(t) {
			return false
		}
		if !w.evict(uint64(rng.Intn(300))) {
			return false
		}
	}
	return true
}

// TestIndexMatchesExactScan is the property test: over random engine
// histories (ops, views, releases, references, plans - nested, some
// abandoned -, every heuristic, both modes, random exponents and minimum
// sizes) the index returns the same victim as an exact scan at every
// eviction, reserve candidates included, and the soft-hold counts are those
// of the open plans after every step.
func TestIndexMatchesExactScan(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 50
	}
	picks, reserve, abandoned, built := 0, 0, 0, 0
	var resets uint64
	for seed := int64(1); seed <= int64(seeds); seed++ {
		w := newTwin(t, seed)
		finished := true
		for i := 0; i < 400; i++ {
			if i > 0 && i == w.budgetAt {
				w.bothArg("budget", int64(w.budget), func(e *Engine) error { e.SetBudget(w.budget); return nil })
				built++
			}
			if !w.step() {
				finished = false
				break // out of memory (both agreed) or plans abandoned
			}
			checkSoftHolds(t, w.idx, fmt.Sprintf("seed %d step %d", seed, i))
		}
		if finished || w.abandoned {
			require.Zero(t, w.idx.PlanHolds(), "seed %d: every plan run to the end or abandoned releases its hold", seed)
		}
		if w.abandoned {
			abandoned++
		}
		checkSoftHolds(t, w.idx, fmt.Sprintf("seed %d, end", seed))
		picks += int(w.idx.Stats().VictimSearches)
		if x := w.idx.sel.(*lazySelector).index; x != nil {
			resets += x.resets
		}
		reserve += int(w.idx.Stats().ReserveEvictions)
		require.Equal(t, w.idx.Stats().Evictions, w.scan.Stats().Evictions)
		require.Equal(t, w.idx.Stats().ReserveEvictions, w.scan.Stats().ReserveEvictions)
		require.Equal(t, w.idx.Clock(), w.scan.Clock())
	}
	t.Logf("%d histories (%d given a budget late), %d ended by abandoned plans, %d victim selections compared, %d reserve victims, %d corrected keys reset by a fall",
		seeds, built, abandoned, picks, reserve, resets)
	require.Greater(t, picks, 1000)
	require.Positive(t, reserve, "some victims are reserve candidates")
	require.Positive(t, abandoned, "some histories abandon their plans")
	require.Positive(t, built, "some histories run long without a budget in reach, then get one (the lazy index built late)")
	require.Positive(t, resets, "falls of neighbourhood costs reset corrected keys (indexSelector.fell)")
}
