// Package replay runs a parsed DTR trace (package recompute) under a memory
// budget with the eviction engine (package evict), the way the DTR authors'
// simulator does: before each op its inputs are made resident (evicted ones
// rebuilt by a rematerialization plan, ancestors first, inputs locked), room
// is made for its outputs by the engine's budget loop, and the op runs. An
// unlimited budget gives the baseline (peak memory, compute time). Memory is
// modelled by a MemoryModel: Counting (bytes, as the simulator counts them)
// or a model that places every storage in a real allocator.
package replay

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/satmath"
	rc "github.com/memscale/memscale/recompute"
)

// Status is how a replay ended.
type Status uint8

// Replay statuses.
const (
	// OK: the trace ran to the end under the budget.
	OK Status = iota
	// OOM: memory was needed and nothing was evictable.
	OOM
	// OverLimit: the compute overhead passed the limit and the run stopped.
	OverLimit
)

// String names the status.
func (s Status) String() string {
	switch s {
	case OK:
		return "ok"
	case OOM:
		return "oom"
	case OverLimit:
		return "over-limit"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// MarshalText implements encoding.TextMarshaler.
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// DefaultOverheadLimit is the overhead at which a run is abandoned, as in
// the DTR authors' evaluation.
const DefaultOverheadLimit = 2.0

// Options configure a replay.
type Options struct {
	// Budget is the memory budget in bytes; 0 = unlimited (the baseline).
	Budget uint64
	// Engine configures the engine; its Budget and Usage are set by Run.
	Engine evict.Config
	// OverheadLimit stops the run when total compute / baseline compute
	// exceeds it (0 = DefaultOverheadLimit, negative = never).
	OverheadLimit float64
	// Memory places storages; nil = Counting.
	Memory MemoryModel
	// Check verifies invariants after every instruction: usage within the
	// budget, the engine's byte count equal to the resident storages, every
	// op input resident. A violation is an error.
	Check bool
	// Plans rebuilds evicted tensors the way the C ABI does: the engine's
	// whole plan is computed and committed (the engine holds the inputs of
	// the step about to run), and its steps run in order; an input of a step
	// that was evicted since the plan was made is rebuilt by a plan of its
	// own first. By default the replay rebuilds them like the DTR authors'
	// simulator: depth first, locking an op's resident inputs just before
	// rebuilding its missing ones.
	Plans bool
	// Region rebuilds as the plugin's region does (it implies Plans'
	// plans; region.go): an op's inputs made resident in argument order,
	// the storages of a rebuild's outer levels parked in host memory
	// (evict.Engine.Park, with Engine.Park set) when an inner level finds no
	// room, the outermost rebuild started over after a nested one found no
	// room, and room made at the end for every output at once. It predicts
	// the least budget a live step runs at (package autotune's LeastBudget).
	Region bool
	// Record has the engine record the program it runs (evict.Config.Record)
	// and returns the recording in Result.Recording: the trace as the C ABI
	// would have reported it, which package autotune tunes on.
	Record bool
}

// Result is the outcome of one replay.
type Result struct {
	// Heuristic is the heuristic the engine used.
	Heuristic string `json:"heuristic"`
	// Memory is the memory model's name.
	Memory string `json:"memory"`
	// Budget is the budget in bytes (0 = unlimited).
	Budget uint64 `json:"budget"`
	// Status is how the run ended; Reason explains a failure.
	Status Status `json:"status"`
	Reason string `json:"reason,omitempty"`
	// BaseCompute is the trace's compute (sum of op times) in ns.
	BaseCompute int64 `json:"base_compute_ns"`
	// Compute is the compute spent, including rematerialization and swap
	// time, in ns (up to the point where the run stopped).
	Compute int64 `json:"compute_ns"`
	// Overhead is the engine clock (1 + Compute) / BaseCompute, the DTR
	// authors' definition.
	Overhead float64 `json:"overhead"`
	// Evictions, EagerEvictions, Banished, Rematerializations, SwapsOut and
	// SwapsIn are the engine's counters.
	Evictions          int64 `json:"evictions"`
	EagerEvictions     int64 `json:"eager_evictions"`
	Banished           int64 `json:"banished"`
	Rematerializations int64 `json:"rematerializations"`
	SwapsOut           int64 `json:"swaps_out"`
	SwapsIn            int64 `json:"swaps_in"`
	// Peak is the highest memory use in bytes.
	Peak uint64 `json:"peak_bytes"`
	// MinBudget is the engine's lower bound on the budget of this program
	// (evict.Engine.MinBudget): pinned bytes plus the largest working set
	// of one op or re-run, as far as the run went.
	MinBudget uint64 `json:"min_budget_bytes"`
	// VictimSearches and VictimSearchTime measure victim selection.
	VictimSearches   int64         `json:"victim_searches"`
	VictimSearchTime time.Duration `json:"victim_search_ns"`
	// Instructions is the number of trace instructions executed.
	Instructions int `json:"instructions"`
	// Wall is the replay's wall time.
	Wall time.Duration `json:"wall_ns"`
	// Recording is the engine's recording of the program (Options.Record;
	// up to where the run stopped).
	Recording *rc.Trace `json:"-"`
}

// Feasible reports whether the run finished.
func (r Result) Feasible() bool { return r.Status == OK }

// Short formats the result the way the DTR paper's tables do: "oom", ">2x"
// (past the overhead limit) or the overhead to 3 decimals.
func (r Result) Short() string {
	switch r.Status {
	case OOM:
		return "oom"
	case OverLimit:
		return ">2x"
	}
	return fmt.Sprintf("%.3f", r.Overhead)
}

// errStop carries a status that ends a run early.
type errStop struct {
	status Status
	err    error
}

func (e *errStop) Error() string { return e.err.Error() }
func (e *errStop) Unwrap() error { return e.err }

// Budget is the budget for a ratio of a baseline peak, rounded down as the
// DTR authors' evaluation does (int(peak * ratio)), and at least 1 byte: a
// budget of 0 means unlimited.
func Budget(ratio float64, peak uint64) uint64 { return max(uint64(ratio*float64(peak)), 1) }

// BaseCompute returns the sum of the trace's op times in ns, saturating at
// math.MaxInt64.
func BaseCompute(tr *rc.Trace) int64 {
	var n int64
	for _, in := range tr.All() {
		if in.Kind == rc.KindCall || in.Kind == rc.KindMutate {
			n = satmath.AddInt64(n, in.Time)
		}
	}
	return n
}

// reserveLimit is the largest count evict.Config.Reserve accepts.
const reserveLimit = 1 << 26

// graphSize counts the ops, tensors and storages a replay of tr adds to the
// engine's graph, so that the engine makes room for them up front instead
// of growing (and copying) its arrays: growth leaves up to a quarter of
// each unused and, while it copies, holds the old and the new array
// (issue 32). Counts above what Reserve accepts are left at zero.
func graphSize(tr *rc.Trace) evict.GraphSize {
	var n evict.GraphSize
	for _, in := range tr.All() {
		switch in.Kind {
		case rc.KindConstant:
			n.Tensors++
			n.Storages++
		case rc.KindCall, rc.KindMutate:
			n.Ops++
			n.Tensors += len(in.Outs)
			for _, o := range in.Outs {
				if o.Alias < 0 {
					n.Storages++
				}
			}
		}
	}
	clamp := func(x *int) {
		if *x > reserveLimit {
			*x = 0
		}
	}
	clamp(&n.Ops)
	clamp(&n.Tensors)
	clamp(&n.Storages)
	return n
}

type runner struct {
	tr       *rc.Trace
	cur      rc.Instr // the instruction being run
	opt      Options
	eng      *evict.Engine
	mem      MemoryModel
	counter  bool // mem is Counting: no placement work
	ids      []rc.TensorID
	blocks   []Block // per engine tensor (storage roots) when placing: block+1
	reserved []Block // blocks placed by reserve, not yet taken
	buf      []evict.Victim
	steps    [][]rc.Step // plan buffers, one per nesting level
	depth    int         // nesting level of materializePlan
	args     []rc.TensorID
	missing  []int
	frames   []lazyFrame
	outs     []evict.Output
	limit    int64 // remat compute allowed; <0 = none
	res      Result
	// Options.Region (region.go): the locks taken, to be released in
	// order; the inputs each open level of a rebuild reads, outermost
	// first; the tensors whose re-runs found no room.
	held       []rc.TensorID
	levels     [][]rc.TensorID
	roomFailed []rc.TensorID
}

// Run replays tr under opt. Running out of memory and passing the overhead
// limit are statuses of the Result; the error reports a malformed trace, a
// memory model failure, or (with Check) a broken invariant.
func Run(tr *rc.Trace, opt Options) (Result, error) {
	start := time.Now()
	r := &runner{tr: tr, opt: opt, mem: opt.Memory}
	if r.mem == nil {
		r.mem = Counting{}
	}
	_, r.counter = r.mem.(Counting)
	cfg := opt.Engine
	cfg.Budget = opt.Budget
	cfg.Usage = r.mem.UsageSource()
	cfg.Record = cfg.Record || opt.Record
	if cfg.Reserve == (evict.GraphSize{}) {
		cfg.Reserve = graphSize(tr)
	}
	eng, err := evict.New(cfg)
	if err != nil {
		return Result{}, fmt.Errorf("replay: %w", err)
	}
	r.eng = eng
	r.ids = make([]rc.TensorID, tr.NumTensors())
	r.buf = make([]evict.Victim, 64)
	base := BaseCompute(tr)
	r.res = Result{Heuristic: eng.Heuristic().String(), Memory: r.mem.Name(), Budget: opt.Budget, BaseCompute: base}
	lim := opt.OverheadLimit
	if lim == 0 {
		lim = DefaultOverheadLimit
	}
	r.limit = -1
	if lim > 0 {
		r.limit = math.MaxInt64
		if l := float64(base) * (lim - 1); l < math.MaxInt64 {
			r.limit = int64(l)
		}
	}
	err = r.run()
	if ferr := r.freeAll(); ferr != nil && err == nil {
		err = fmt.Errorf("replay: %w", ferr)
	}
	var stop *errStop
	if errors.As(err, &stop) {
		r.res.Status, r.res.Reason, err = stop.status, stop.err.Error(), nil
	}
	st := eng.Stats()
	r.res.Compute = satmath.AddInt64(satmath.AddInt64(st.BaseCostNS, st.RematCostNS), st.SwapCostNS)
	if base > 0 {
		r.res.Overhead = float64(st.Clock) / float64(base)
	}
	r.res.Evictions, r.res.EagerEvictions, r.res.Banished = st.Evictions, st.EagerEvictions, st.Banished
	r.res.Rematerializations, r.res.SwapsOut, r.res.SwapsIn = st.Rematerializations, st.SwapsOut, st.SwapsIn
	r.res.Peak = st.PeakUsage
	r.res.MinBudget = eng.MinBudget().Bytes()
	if !r.counter {
		r.res.Peak = r.mem.Peak()
	}
	r.res.VictimSearches, r.res.VictimSearchTime = st.VictimSearches, time.Duration(st.VictimSearchNS)
	if opt.Record {
		rec, rerr := eng.Recording()
		if rerr != nil && err == nil {
			err = fmt.Errorf("replay: %w", rerr)
		}
		r.res.Recording = rec
	}
	r.res.Wall = time.Since(start)
	if endHook != nil {
		endHook(eng)
	}
	return r.res, err
}

// endHook, when set (by tests), sees the engine at the end of every Run,
// while the runner's structures are still alive: the memory benchmark
// measures the live heap there.
var endHook func(*evict.Engine)

func (r *runner) run() error {
	for i := range r.tr.Len() {
		r.cur = r.tr.At(i)
		in := &r.cur
		if err := r.step(in); err != nil {
			var stop *errStop
			if errors.As(err, &stop) {
				stop.err = fmt.Errorf("%s at trace line %d: %w", in.Kind, in.Line, stop.err)
				return stop
			}
			return fmt.Errorf("replay: %s at trace line %d: %w", in.Kind, in.Line, err)
		}
		r.res.Instructions++
		if r.opt.Check {
			if err := r.check(i%1024 == 0); err != nil {
				return fmt.Errorf("replay: invariant broken after %s at trace line %d: %w", in.Kind, in.Line, err)
			}
		}
	}
	// Everything still referenced is an output: it must be resident.
	if r.opt.Region {
		if err := r.leaveRegion(); err != nil {
			return err
		}
		if r.opt.Check {
			return r.check(true)
		}
		return nil
	}
	for _, t := range r.tr.Outputs {
		id := r.ids[t]
		if err := r.materialize(id); err != nil {
			return r.outputLost(t, err)
		}
		if err := r.eng.Pin(id); err != nil {
			return fmt.Errorf("replay: pinning output %s: %w", r.tr.Names[t], err)
		}
	}
	if r.opt.Check {
		return r.check(true)
	}
	return nil
}

func (r *runner) step(in *rc.Instr) error {
	switch in.Kind {
	case rc.KindConstant:
		if err := r.allocate(in.Size); err != nil {
			return err
		}
		if !r.counter {
			if err := r.reserve(true, in.Size); err != nil {
				return err
			}
		}
		id, err := r.eng.AddTensor(in.Size, true)
		if err != nil {
			return fmt.Errorf("line %d: %w", in.Line, err)
		}
		r.ids[in.T] = id
		if !r.counter {
			r.assign(id, r.take()[0])
		}
		return nil
	case rc.KindCall, rc.KindMutate:
		if r.opt.Region {
			return r.callRegion(in)
		}
		return r.call(in)
	case rc.KindCopy:
		return r.eng.Retain(r.ids[in.T])
	case rc.KindCopyFrom:
		if err := r.eng.Retain(r.ids[in.T]); err != nil {
			return err
		}
		return r.release(r.ids[in.Old])
	case rc.KindRelease:
		return r.release(r.ids[in.T])
	case rc.KindAnnotate:
		return nil
	case rc.KindPin:
		// a recorded engine's pin (a gradient kept): resident for good
		id := r.ids[in.T]
		if r.opt.Region {
			mark := len(r.held)
			if err := r.rebuildRegion(id); err != nil {
				return err
			}
			if err := r.eng.Pin(id); err != nil {
				return err
			}
			return r.regionRelease(mark)
		}
		if err := r.materialize(id); err != nil {
			return err
		}
		return r.eng.Pin(id)
	}
	return fmt.Errorf("unknown instruction kind %d", in.Kind)
}

func (r *runner) release(t rc.TensorID) error {
	if err := r.eng.Release(t); err != nil {
		return err
	}
	return r.drain()
}

// call runs a CALL or MUTATE: make the inputs resident, make room, run.
func (r *runner) call(in *rc.Instr) error {
	args, err := r.accessArgs(in)
	if err != nil {
		return err
	}
	g := r.eng.Graph()
	// As the simulator does: lock what is resident, then bring back the
	// rest one by one (an argument may come back with an earlier one's
	// plan) and lock it.
	missing := r.missing[:0]
	for i, a := range args {
		if g.IsResident(a) {
			if err := r.eng.Lock(a); err != nil {
				return err
			}
		} else {
			missing = append(missing, i)
		}
	}
	r.missing = missing
	for _, i := range missing {
		a := args[i]
		if !g.IsResident(a) {
			if err := r.materialize(a); err != nil {
				return err
			}
		}
		if err := r.eng.Lock(a); err != nil {
			return err
		}
	}
	if err := r.runOp(in, args); err != nil {
		return err
	}
	for _, a := range args {
		if err := r.eng.Unlock(a); err != nil {
			return err
		}
	}
	return r.afterOp(in, args)
}

// accessArgs maps in's arguments to the engine's ids (into r.args, reused)
// and tells the engine each is accessed (both call and callRegion).
func (r *runner) accessArgs(in *rc.Instr) ([]rc.TensorID, error) {
	args := r.args[:0]
	for _, a := range in.Args {
		args = append(args, r.ids[a])
	}
	r.args = args
	for _, a := range args {
		if err := r.eng.Access(a); err != nil {
			return nil, err
		}
	}
	return args, nil
}

// afterOp ends a CALL or MUTATE once its inputs are unlocked: a MUTATE's old
// versions are released, then the engine's pending frees drained.
func (r *runner) afterOp(in *rc.Instr, args []rc.TensorID) error {
	if in.Kind == rc.KindMutate {
		for _, m := range in.Mutated {
			if err := r.eng.Release(args[m]); err != nil {
				return err
			}
		}
	}
	return r.drain()
}

// outputLost says which output of the step could not be brought back at its
// end (a replay that ran out of room stays one: errStop).
func (r *runner) outputLost(t int32, err error) error {
	var stop *errStop
	if errors.As(err, &stop) {
		stop.err = fmt.Errorf("bringing back output %s at the end: %w", r.tr.Names[t], stop.err)
		return stop
	}
	return fmt.Errorf("replay: bringing back output %s: %w", r.tr.Names[t], err)
}

// runOp runs in with its inputs args resident and locked: room for what it
// allocates, then the engine's Call, its results bound to the trace's ids
// (both the simulator's call and the region's callRegion).
func (r *runner) runOp(in *rc.Instr, args []rc.TensorID) error {
	outs := r.outs[:0]
	var fresh uint64
	for _, o := range in.Outs {
		outs = append(outs, evict.Output{Size: o.Size, Alias: o.Alias})
		if o.Alias < 0 {
			fresh = satmath.AddUint64(fresh, o.Size)
		}
	}
	r.outs = outs
	if err := r.allocate(fresh); err != nil {
		return err
	}
	if r.opt.Check {
		for i, a := range args {
			if !r.eng.Graph().IsResident(a) {
				return fmt.Errorf("op %s input %d (%s) is not resident when it runs", in.Op, i, r.tr.Names[in.Args[i]])
			}
		}
	}
	if err := r.placeOutputs(in); err != nil {
		return err
	}
	_, ids, err := r.eng.Call(in.Op, args, outs, in.Time, 0)
	if err != nil {
		return err
	}
	r.bindOutputs(in, ids)
	return nil
}

// placeOutputs places the fresh outputs of in with the memory model (not
// Counting) before the op runs.
func (r *runner) placeOutputs(in *rc.Instr) error {
	if r.counter {
		return nil
	}
	var sizes []uint64
	for _, o := range in.Outs {
		if o.Alias < 0 {
			sizes = append(sizes, o.Size)
		}
	}
	return r.reserve(false, sizes...)
}

// bindOutputs maps in's outputs to the engine's tensors ids and gives the
// fresh ones the blocks placeOutputs placed.
func (r *runner) bindOutputs(in *rc.Instr, ids []rc.TensorID) {
	var blocks []Block
	if !r.counter {
		blocks = r.take()
	}
	k := 0
	for i, o := range in.Outs {
		r.ids[o.T] = ids[i]
		if o.Alias < 0 && !r.counter {
			r.assign(ids[i], blocks[k])
			k++
		}
	}
}

// materialize makes t resident.
func (r *runner) materialize(t rc.TensorID) error {
	if r.opt.Plans {
		return r.materializePlan(t)
	}
	return r.materializeLazy(t)
}

// lazyFrame is one pending re-run of materializeLazy.
type lazyFrame struct {
	t       rc.TensorID
	op      rc.OpID
	missing []int32 // indices of inputs that were not resident
	next    int32   // next entry of missing to bring back
}

// materializeLazy rebuilds t depth first on an explicit stack, as the
// simulator does: for each op to re-run, mark its inputs accessed, lock the
// resident ones, rebuild the missing ones one by one (locking each), make
// room, re-run, unlock.
func (r *runner) materializeLazy(t rc.TensorID) error {
	g := r.eng.Graph()
	if g.IsResident(t) {
		return nil
	}
	stack := r.frames[:0]
	push := func(x rc.TensorID) error {
		tx := g.Tensor(x)
		if tx.Defined && g.Storage(tx.Storage).State == rc.Swapped {
			return r.swapIn(g.Storage(tx.Storage).Root)
		}
		if tx.Op == rc.NoOp {
			return fmt.Errorf("tensor %d is external and not resident: %w", x, rc.ErrNotRecomputable)
		}
		op := g.Op(tx.Op)
		for _, in := range op.Inputs {
			if err := r.eng.Access(in); err != nil {
				return err
			}
		}
		f := lazyFrame{t: x, op: tx.Op}
		for i, in := range op.Inputs {
			if g.IsResident(in) {
				if err := r.eng.Lock(in); err != nil {
					return err
				}
			} else {
				f.missing = append(f.missing, int32(i))
			}
		}
		stack = append(stack, f)
		return nil
	}
	if err := push(t); err != nil {
		return err
	}
	for len(stack) > 0 {
		f := &stack[len(stack)-1]
		op := g.Op(f.op)
		if int(f.next) < len(f.missing) {
			in := op.Inputs[f.missing[f.next]]
			if !g.IsResident(in) {
				if err := push(in); err != nil {
					return err
				}
				continue
			}
			// brought back with an earlier input's op
			if err := r.eng.Lock(in); err != nil {
				return err
			}
			f.next++
			continue
		}
		if err := r.allocate(g.FreshSize(f.op)); err != nil {
			return err
		}
		if err := r.rerunPlaced(f.op, f.t); err != nil {
			return err
		}
		// The frame below waits for this tensor: lock it before the
		// inputs go, or an unreferenced view could leave with its base.
		if len(stack) > 1 {
			if err := r.eng.Lock(f.t); err != nil {
				return err
			}
			stack[len(stack)-2].next++
		}
		for _, in := range op.Inputs {
			if err := r.eng.Unlock(in); err != nil {
				return err
			}
		}
		stack = stack[:len(stack)-1]
		if err := r.overLimit(); err != nil {
			return err
		}
	}
	r.frames = stack[:0]
	if !g.IsResident(t) {
		return fmt.Errorf("tensor %d was rebuilt but is not resident", t)
	}
	return nil
}

func (r *runner) swapIn(root rc.TensorID) error {
	size := r.eng.Graph().StorageOf(root).Size
	if err := r.allocate(size); err != nil {
		return err
	}
	if !r.counter {
		if err := r.reserve(false, size); err != nil {
			return err
		}
	}
	if err := r.eng.SwappedIn(root); err != nil {
		return err
	}
	if !r.counter {
		r.assign(root, r.take()[0])
	}
	return nil
}

func (r *runner) overLimit() error {
	if r.limit < 0 {
		return nil
	}
	if s := r.eng.Stats(); satmath.AddInt64(s.RematCostNS, s.SwapCostNS) > r.limit {
		return &errStop{status: OverLimit, err: fmt.Errorf("overhead above the limit: rematerialization cost %d ns > %d ns allowed",
			satmath.AddInt64(s.RematCostNS, s.SwapCostNS), r.limit)}
	}
	return nil
}

// plan is the engine's plan for t, in the buffer kept for this rebuild depth.
func (r *runner) plan(t rc.TensorID) ([]rc.Step, error) {
	if r.depth == len(r.steps) {
		r.steps = append(r.steps, nil)
	}
	steps, err := r.eng.Plan(t, r.steps[r.depth][:0])
	if err != nil {
		return nil, err
	}
	r.steps[r.depth] = steps[:0]
	return steps, nil
}

// materializePlan makes t resident by running the engine's plan. The
// engine holds the inputs of the step about to run; an input that is not
// resident when its step comes (the budget loop took it while earlier steps
// ran) is rebuilt first by a nested plan, as the C ABI's callers do.
func (r *runner) materializePlan(t rc.TensorID) error {
	steps, err := r.plan(t)
	if err != nil {
		return err
	}
	if len(steps) == 0 {
		return nil
	}
	if err := r.eng.HoldPlan(steps); err != nil {
		return err
	}
	r.depth++
	defer func() { r.depth-- }()
	g := r.eng.Graph()
	for _, st := range steps {
		switch st.Kind {
		case rc.StepRerun:
			for _, in := range g.Op(st.Op).Inputs {
				if !g.IsResident(in) {
					if err := r.materializePlan(in); err != nil {
						return err
					}
				}
			}
			if err := r.allocate(g.FreshSize(st.Op)); err != nil {
				return err
			}
			if err := r.rerunPlaced(st.Op, -1); err != nil {
				return err
			}
		case rc.StepSwapIn:
			if g.StorageOf(st.Tensor).State != rc.Swapped {
				continue // brought back by a nested plan already
			}
			if err := r.swapIn(st.Tensor); err != nil {
				return err
			}
		}
		if err := r.overLimit(); err != nil {
			return err
		}
	}
	if !g.IsResident(t) {
		return fmt.Errorf("plan for tensor %d ran but it is not resident", t)
	}
	return nil
}

// allocate makes room for n bytes under the budget.
func (r *runner) allocate(n uint64) error {
	for {
		k, err := r.eng.Evict(n, r.buf)
		if err != nil {
			if errors.Is(err, evict.ErrNoEvictable) {
				return &errStop{status: OOM, err: err}
			}
			return err
		}
		if err := r.freeVictims(r.buf[:k]); err != nil {
			return err
		}
		if k == len(r.buf) {
			continue // there may be more
		}
		if b := r.eng.Budget(); b == 0 || r.eng.Usage()+n <= b {
			return nil
		}
		// Evict stopped after some victims because nothing else was
		// evictable; the next call reports it.
	}
}

// drain hands the storages freed by releases to the memory model.
func (r *runner) drain() error {
	if r.counter {
		// Counting memory needs no frees; still empty the queue.
		for {
			k, err := r.eng.Evict(0, r.buf)
			if err != nil {
				return err
			}
			if k < len(r.buf) {
				return nil
			}
		}
	}
	return r.allocate(0)
}
