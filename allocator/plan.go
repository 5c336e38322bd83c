package allocator

import (
	"container/heap"
	"math"
	"math/rand"
	"slices"

	"github.com/google/btree"
	"go.uber.org/zap"

	"github.com/memscale/memscale/device"
)

// Step plans (issue 29): a training step under a DTR budget repeats the same
// sequence of large requests, and the engine holds allocated bytes at the
// budget all through it, so a cache bounded near the budget is always full
// and best fit leaves holes that the next large request does not fit: the
// miss is served by remapping granules. Told where steps begin
// (StepBoundary), the allocator records each step's large-pool requests
// (rounded size, stream, when each was allocated and freed) and, at the
// boundary, computes a placement of the step's requests with every lifetime
// known: a greedy offline dynamic-storage-allocation plan (largest first,
// each at the lowest offset free for its whole lifetime; searchPlan improves
// a plan that does not fit), per stream, in an expandable segment of its own
// (the stream's idle segment when it has one). The next step places the
// n-th request of a rounded size and stream at the offset of the plan's n-th
// such request if that range is still free; any other request falls back to
// best fit in the ordinary segments, which never see the plan segments' free
// memory. A plan is used when its span plus the peak of the step's other
// memory fits the cache bound (budget x (1 + BudgetSlack)), or needs at most
// planOver times it: then the granules the plan cannot hold at once are
// remapped within the step (stealPlanned), and the plan is dropped if that
// costs more than best fit did. Otherwise best fit runs as without a
// boundary. A step whose requests are those of the step before reuses its
// plan as it is (no recomputation, no remapping).

// maxPlanRecords bounds the large requests recorded per step; a longer step
// gets no plan.
const maxPlanRecords = 1 << 18

// planKey is a request's rounded size and stream.
type planKey struct {
	size   uint64
	stream device.Stream
}

// planQueue is the plan's entries of one key and the next one to use.
type planQueue struct {
	idx  []int32
	next int
}

// planRec is one large request of a recorded step.
type planRec struct {
	size   uint64
	stream device.Stream
	t0, t1 int32 // allocation and free, in large-request events; t1 < 0: not freed in the step
	off    uint64
	placed bool // in the plan (freed within the step)
}

// stepPlans is the allocator's step-plan state (Allocator.plans).
type stepPlans struct {
	step      uint32 // boundaries seen
	recs      []planRec
	t         int32
	overflow  bool
	liveRec   uint64 // bytes of live blocks recorded in this step
	otherPeak uint64 // peak of allocated bytes outside this step's recorded blocks
	budget    uint64 // the largest budget in force seen during the step
	// remaps0 is num_remap at the step's start; fitRemaps what the last
	// step without a plan remapped (-1: none yet); activeSteps the steps
	// run under plans in a row; overFails and overSkip the backoff of plans
	// over the bound that remapped more than best fit.
	remaps0, fitRemaps  int64
	activeSteps         int
	overFails, overSkip int

	plan   []planRec // the plan in force (from the previous step), in request order
	active bool
	// exact: steps are recorded for a plan (a budget is known): blocks are
	// split to the rounded size (allocFrom).
	exact, wantExact bool
	// byKey lists the plan's entries of each rounded size and stream in
	// request order; next is the entry the next such request gets.
	byKey map[planKey]*planQueue
	segs  map[device.Stream]*segment
	spans map[device.Stream]uint64
	// shift is where each stream's plan starts in its segment (a whole
	// number of granules): where the segment has the most memory mapped.
	shift map[device.Stream]uint64
	uses  map[device.Stream]planUses // per granule, when the plan places into it
	cands []stealCand                // stealPlanned's scratch
	free  *btree.BTreeG[*block]      // free blocks of plan segments, by stream and address

	// fails counts the searches in a row that found no plan that fits;
	// skip the boundaries left before the next search.
	fails, skip int

	steps, built, reused, placedN, missedN int64
	stepPlaced, stepMissed                 int64 // this step's
	lastSpan, lastNeed                     uint64
}

func newStepPlans() *stepPlans {
	return &stepPlans{
		fitRemaps: -1,
		segs:      make(map[device.Stream]*segment),
		spans:     make(map[device.Stream]uint64),
		shift:     make(map[device.Stream]uint64),
		free:      btree.NewG(btreeDegree, addrLess),
	}
}

// StepBoundary tells the allocator that a training step ended and the next
// begins (the program's optimizer step, or the end of a DTR region). With a
// budget known (SetBudget or the eviction threshold) and expandable
// segments, it turns the step just ended into a placement plan for the next
// one (see the step-plan comment in plan.go and Config.NoStepPlan); otherwise
// it only counts steps. Allocations live across the boundary stay where they
// are.
func (a *Allocator) StepBoundary() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.plans == nil {
		return
	}
	p := a.plans
	p.steps++
	// The budget of the step just ended: a region's engine may have
	// withdrawn its budget at the region's exit, before this call.
	bound := a.planBound(max(p.budget, a.budgetInForce()))
	// What the step just ended remapped: best fit's cost when no plan was in
	// force; a plan over the bound that, past its first step (which moves
	// memory into its layout), remaps more than best fit did is dropped and
	// plans over the bound are not tried for a while.
	stepRemaps := a.cnt.remaps - p.remaps0
	dropped := false
	switch {
	case !p.active:
		p.fitRemaps, p.activeSteps = stepRemaps, 0
	case p.lastNeed > bound:
		p.activeSteps++
		if p.activeSteps >= 2 && p.fitRemaps >= 0 && stepRemaps > p.fitRemaps {
			p.overFails = min(p.overFails+1, 6)
			p.overSkip = 1<<p.overFails - 1
			a.retirePlans()
			dropped = true
		}
	default:
		p.activeSteps++
	}
	wasSkipping := p.overSkip > 0 && !dropped
	if p.step > 0 && !p.overflow {
		a.buildPlan(bound)
	} else {
		a.retirePlans()
	}
	if wasSkipping {
		p.overSkip-- // one boundary without a plan over the bound
	}
	p.remaps0 = a.cnt.remaps
	p.stepPlaced, p.stepMissed = 0, 0
	p.step++
	p.recs = p.recs[:0]
	p.t = 0
	p.overflow = false
	p.liveRec = 0
	p.otherPeak = uint64(a.st.cur(stAllocatedBytes))
	for _, q := range p.byKey {
		q.next = 0
	}
	p.budget = a.budgetInForce()
	// Exact splits while a plan is in force or may be made from the step:
	// the first recorded one, or one after a plan that fitted.
	// (Without a budget now - a region that registers its own at entry -
	// the step's first large request turns them on: recordAlloc.)
	p.wantExact = p.active || p.step == 1 || p.lastNeed <= bound
	p.exact = bound > 0 && p.wantExact
	if p.active && a.phys > bound {
		// Growth past the bound (a step that missed its plan): cached
		// memory outside the plans goes back down to the bound.
		a.flushQuick()
		a.refreshMarks(nil)
		if err := a.releaseCachedFrom(a.phys-bound, false); err != nil {
			a.log.Warn("allocator: releasing cached memory over the step plan's bound", zap.Error(err))
		}
	}
	a.publish()
}

// planBound is the reserved bytes a plan and the rest of the step must fit
// under budget b: its cache bound; 0 = no plan.
func (a *Allocator) planBound(b uint64) uint64 {
	if !a.vmm || b == 0 || a.slack < 0 || a.budgetSlack < 0 {
		return 0
	}
	return min(b+uint64(a.budgetSlack*float64(b)), a.limit)
}

// buildPlan turns the recorded step into the plan of the next one, or
// retires the plans when it does not fit the bound.
func (a *Allocator) buildPlan(bound uint64) {
	p := a.plans
	if bound == 0 || len(p.recs) == 0 {
		a.retirePlans()
		return
	}
	// The same requests as the plan in force, or nearly (at most one in
	// planKeepMiss of the step's large requests missed the plan): keep it.
	// Steps whose engine choices vary a little (op costs measured on the
	// device) would otherwise get a new layout, and move memory, each step.
	if p.active && len(p.segs) == len(p.spans) &&
		(samePlan(p.plan, p.recs) || p.stepMissed*planKeepMiss <= p.stepPlaced) {
		p.reused++
		return
	}
	next := slices.Clone(p.recs)
	byStream := map[device.Stream][]*planRec{}
	var streams []device.Stream
	for i := range next {
		r := &next[i]
		r.placed = r.t1 >= 0
		if !r.placed {
			continue
		}
		if byStream[r.stream] == nil {
			streams = append(streams, r.stream)
		}
		byStream[r.stream] = append(byStream[r.stream], r)
	}
	spans := map[device.Stream]uint64{}
	need := p.otherPeak
	for _, s := range streams {
		spans[s] = greedyPlanV(byStream[s], 0)
		need += alignUp(spans[s], a.gran) + a.gran // a granule shared at an edge
	}
	searched := false
	if len(streams) > 0 && need > bound && float64(need) <= planSearchMargin*float64(bound) && p.skip == 0 {
		// Search other orders for the stream with the largest span.
		searched = true
		top := streams[0]
		for _, s := range streams {
			if spans[s] > spans[top] {
				top = s
			}
		}
		rest := need - alignUp(spans[top], a.gran)
		if bound > rest {
			target := alignDown(bound-rest, a.gran)
			spans[top] = searchPlan(byStream[top], target)
			need = rest + alignUp(spans[top], a.gran)
		}
	}
	p.lastNeed = need
	if p.skip > 0 && !searched {
		p.skip--
	}
	over := need > bound && (float64(need) > planOver*float64(bound) || p.overSkip > 0)
	if over || need > a.limit || len(streams) == 0 {
		// Back off: a search that found no plan that fits skips the
		// searches of the next 1, 3, 7, ... boundaries (up to 63).
		if searched {
			p.fails = min(p.fails+1, 6)
			p.skip = 1<<p.fails - 1
		}
		a.log.Debug("allocator: step plan does not fit the bound", zap.Uint64("need", need), zap.Uint64("bound", bound))
		a.retirePlans()
		return
	}
	// Plan segments must be empty to take a new plan.
	for _, s := range streams {
		if seg := p.segs[s]; seg != nil && (!segmentIdle(seg) || seg.size < spans[s]) {
			a.retirePlan(s)
		}
	}
	for s := range p.segs {
		if spans[s] == 0 {
			a.retirePlan(s)
		}
	}
	a.flushQuick()
	for _, s := range streams {
		if p.segs[s] != nil {
			continue
		}
		if seg := a.idleSegment(s, spans[s]); seg != nil {
			// The memory the step used is where the plan goes: most of
			// the planned ranges are mapped already.
			a.setPlan(seg, true)
			p.segs[s] = seg
			continue
		}
		seg, err := a.newPlanSegment(s, spans[s])
		if err != nil {
			a.log.Debug("allocator: no address space for a step plan", zap.Error(err))
			a.retirePlans()
			return
		}
		p.segs[s] = seg
	}
	for _, s := range streams {
		p.shift[s] = a.bestShift(p.segs[s], spans[s])
	}
	p.fails, p.skip = 0, 0
	p.plan, p.spans, p.active = next, spans, true
	p.uses = make(map[device.Stream]planUses, len(streams))
	for _, s := range streams {
		p.uses[s] = a.buildUses(byStream[s], spans[s])
	}
	p.byKey = make(map[planKey]*planQueue)
	for i := range next {
		k := planKey{next[i].size, next[i].stream}
		q := p.byKey[k]
		if q == nil {
			q = &planQueue{}
			p.byKey[k] = q
		}
		q.idx = append(q.idx, int32(i))
	}
	p.built++
	p.lastSpan = 0
	for _, s := range streams {
		p.lastSpan += spans[s]
	}
}

// samePlan reports whether the recorded requests are those of the plan.
func samePlan(plan, recs []planRec) bool {
	if len(plan) != len(recs) {
		return false
	}
	for i := range plan {
		if plan[i].size != recs[i].size || plan[i].stream != recs[i].stream || plan[i].t0 != recs[i].t0 || plan[i].t1 != recs[i].t1 {
			return false
		}
	}
	return true
}

// planKeepMiss: a plan whose step missed it for at most one large request
// in this many is kept as it is.
const planKeepMiss = 50

// planSearchWork caps the pair checks (tries x requests^2) that a plan
// search spends when the first plan does not fit.
const planSearchWork = 4e8

// planOver: a plan is used while it needs at most this times the bound
// (never past the limit); above the bound, the granules the plan cannot hold
// at once are remapped within the step, those whose next planned use is
// furthest first (stealPlanned), and a plan that remaps more than best fit
// did is dropped. Measured (bench/results/alloc-budget-remaps.md): U-Net at
// 30 % of its peak, whose best plan needs 1.035 x the bound, remaps 50-60
// granules per step instead of best fit's 1,065-1,075.
const planOver = 1.2

// planSearchMargin: a plan search runs only when the first plan needs at
// most this times the bound.
const planSearchMargin = 1.25

// planTries caps the orders a plan search tries.
const planTries = 256

// searchPlan places the requests (greedyPlanV, order 0: largest first, each
// at the lowest offset free for its whole lifetime) and, while the span is
// above target, searches: first "squeaky wheel" rounds (each request that
// ends in the top 5 % of the last plan is blamed once more, and the next
// plan places the most blamed first, then by size), then other orders (by
// lifetime, by size x lifetime, best-fitting gap, sizes jittered by up to
// 20 %, fixed seeds: the same step gets the same plan). At most planTries
// rounds of each and planSearchWork pair checks. It keeps the smallest span
// and returns it.
func searchPlan(items []*planRec, target uint64) uint64 {
	best := greedyPlanV(items, 0)
	if best <= target || len(items) < 2 {
		return best
	}
	offs := make([]uint64, len(items))
	keep := func(sp uint64) {
		if sp < best {
			best = sp
			for i, it := range items {
				offs[i] = it.off
			}
		}
	}
	for i, it := range items {
		offs[i] = it.off
	}
	n := float64(len(items))
	tries := max(1, min(planTries, int(planSearchWork/(n*n))))
	order := slices.Clone(items)
	slices.SortStableFunc(order, bySize)
	blame := make(map[*planRec]int, len(order))
	for i := 0; i < tries && best > target; i++ {
		sp := placeGreedy(order, false)
		keep(sp)
		cut := sp - sp/20
		for _, x := range order {
			if x.off+x.size > cut {
				blame[x]++
			}
		}
		slices.SortStableFunc(order, func(x, y *planRec) int {
			if blame[x] != blame[y] {
				return blame[y] - blame[x]
			}
			return bySize(x, y)
		})
	}
	for v := 1; v <= min(tries, 16) && best > target; v++ {
		keep(greedyPlanV(items, v))
	}
	for i, it := range items {
		it.off = offs[i]
	}
	return best
}

// bySize orders requests largest first, then by allocation time.
func bySize(x, y *planRec) int {
	if x.size != y.size {
		if x.size > y.size {
			return -1
		}
		return 1
	}
	return int(x.t0 - y.t0)
}

// greedyPlanV places the requests in order v (see searchPlan), each at the
// lowest offset free for its whole lifetime (or, for orders 3-5, the
// smallest gap that holds it), and returns the span.
func greedyPlanV(items []*planRec, v int) uint64 {
	order := slices.Clone(items)
	if v >= 6 {
		// Random perturbation: size desc with sizes jittered by up to 20 %.
		rng := rand.New(rand.NewSource(int64(v)))
		jit := make(map[*planRec]float64, len(order))
		for _, x := range order {
			jit[x] = float64(x.size) * (1 + 0.2*rng.Float64())
		}
		slices.SortStableFunc(order, func(x, y *planRec) int {
			if jit[x] > jit[y] {
				return -1
			}
			if jit[x] < jit[y] {
				return 1
			}
			return 0
		})
		return placeGreedy(order, false)
	}
	key := func(x *planRec) uint64 {
		switch v % 3 {
		case 1:
			return uint64(x.t1 - x.t0)
		case 2:
			return x.size * uint64(x.t1-x.t0)
		}
		return x.size
	}
	slices.SortStableFunc(order, func(x, y *planRec) int {
		if kx, ky := key(x), key(y); kx != ky {
			if kx > ky {
				return -1
			}
			return 1
		}
		return int(x.t0 - y.t0)
	})
	return placeGreedy(order, v >= 3)
}

func placeGreedy(order []*planRec, bestFit bool) uint64 {
	// placed is kept by offset: the requests conflicting with the next one
	// are met in offset order, and the first gap that holds it ends the
	// scan (lowest offset).
	placed := make([]*planRec, 0, len(order))
	var span uint64
	for _, it := range order {
		var off uint64
		bestGap := uint64(math.MaxUint64)
		var bestOff uint64
		for _, q := range placed {
			if q.t0 >= it.t1 || it.t0 >= q.t1 {
				continue // not live at the same time
			}
			if q.off >= off+it.size {
				if !bestFit {
					break
				}
				if g := q.off - off; g < bestGap {
					bestGap, bestOff = g, off
				}
			}
			off = max(off, q.off+q.size)
		}
		if bestFit && bestGap != math.MaxUint64 {
			off = bestOff
		}
		it.off = off
		span = max(span, off+it.size)
		i, _ := slices.BinarySearchFunc(placed, off, func(q *planRec, o uint64) int {
			switch {
			case q.off < o:
				return -1
			case q.off > o:
				return 1
			}
			return 0
		})
		placed = slices.Insert(placed, i, it)
	}
	return span
}

// segmentIdle reports whether seg has no block in use.
func segmentIdle(seg *segment) bool {
	for b := seg.head; b != nil; b = b.next {
		if b.state == stateAllocated || b.state == statePending {
			return false
		}
	}
	return true
}

// newPlanSegment reserves the plan segment of stream s.
func (a *Allocator) newPlanSegment(s device.Stream, span uint64) (*segment, error) {
	if err := a.newSegment(largePool, s, span); err != nil {
		return nil, err
	}
	list := a.segs[segKey{largePool, s}]
	seg := list[len(list)-1]
	seg.plan = true
	return seg, nil
}

// retirePlans ends every plan: the plan segments become ordinary segments.
func (a *Allocator) retirePlans() {
	p := a.plans
	for s := range p.segs {
		a.retirePlan(s)
	}
	p.active, p.plan, p.byKey = false, nil, nil
}

// retirePlan turns stream s's plan segment into an ordinary one: its free
// blocks move to the large pool's tree.
func (a *Allocator) retirePlan(s device.Stream) {
	p := a.plans
	seg := p.segs[s]
	delete(p.segs, s)
	delete(p.spans, s)
	if seg == nil {
		return
	}
	a.setPlan(seg, false)
}

// setPlan makes seg a plan segment or an ordinary one, moving its free
// blocks (none in the quick cache) between the trees.
func (a *Allocator) setPlan(seg *segment, plan bool) {
	var move []*block
	for b := seg.head; b != nil; b = b.next {
		if b.state == stateFree {
			move = append(move, b)
		}
	}
	for _, b := range move {
		a.removeFree(b)
	}
	seg.plan = plan
	for _, b := range move {
		a.addFree(b)
	}
}

// idleSegment returns the ordinary expandable large-pool segment of stream
// s with room for span bytes, no block in use and the most memory mapped, or
// nil.
func (a *Allocator) idleSegment(s device.Stream, span uint64) *segment {
	var best *segment
	for _, seg := range a.segs[segKey{largePool, s}] {
		if !seg.expandable || seg.plan || seg.size < span || !segmentIdle(seg) {
			continue
		}
		if best == nil || seg.mapped > best.mapped {
			best = seg
		}
	}
	return best
}

// recordAlloc records the large block b just handed out.
func (a *Allocator) recordAlloc(b *block) {
	p := a.plans
	if len(p.recs) >= maxPlanRecords || p.t == math.MaxInt32 {
		p.overflow = true
		return
	}
	p.budget = max(p.budget, a.budgetInForce())
	if !p.exact && p.wantExact && a.planBound(p.budget) > 0 {
		p.exact = true
	}
	p.recs = append(p.recs, planRec{size: b.size, stream: b.stream, t0: p.t, t1: -1})
	p.t++
	b.rec = int32(len(p.recs))
	b.recStep = p.step
	p.liveRec += b.size
}

// recordFree records the free of b, if it was recorded in this step.
func (a *Allocator) recordFree(b *block) {
	p := a.plans
	if b.rec == 0 || b.recStep != p.step {
		return
	}
	if i := int(b.rec) - 1; i < len(p.recs) && p.t < math.MaxInt32 {
		p.recs[i].t1 = p.t
		p.t++
		p.liveRec -= b.size
	}
	b.rec = 0
}

// planPlace serves a large request of r bytes on stream s from the plan in
// force: the n-th request of its rounded size and stream in the step gets
// the place of the n-th such request of the plan, if that range is still
// free; it returns the detached block, or nil.
func (a *Allocator) planPlace(r uint64, s device.Stream) *block {
	p := a.plans
	q := p.byKey[planKey{r, s}]
	if q == nil || q.next >= len(q.idx) {
		p.missedN++
		p.stepMissed++
		return nil
	}
	e := &p.plan[q.idx[q.next]]
	q.next++
	seg := p.segs[s]
	if !e.placed || seg == nil {
		p.missedN++
		p.stepMissed++
		return nil
	}
	b := a.takeRange(seg, seg.base+device.Ptr(p.shift[s]+e.off), r)
	if b == nil {
		p.missedN++
		p.stepMissed++
		return nil
	}
	p.placedN++
	p.stepPlaced++
	return b
}

// takeRange maps what is unmapped of [lo, lo+r) in the plan segment seg and
// returns it as a detached free block, or nil when a block in use overlaps
// it or no memory could be had.
func (a *Allocator) takeRange(seg *segment, lo device.Ptr, r uint64) *block {
	hi := lo + device.Ptr(r)
	if hi > seg.end() {
		return nil
	}
	// The block holding lo: a free one of the plan tree or an unmapped one.
	var first *block
	a.pivot = block{stream: seg.stream, addr: lo}
	a.plans.free.DescendLessOrEqual(&a.pivot, func(b *block) bool {
		if b.seg == seg && b.end() > lo {
			first = b
		}
		return false
	})
	if first == nil {
		a.pools[largePool].unmapped.DescendLessOrEqual(&a.pivot, func(b *block) bool {
			if b.seg == seg && b.end() > lo {
				first = b
			}
			return false
		})
	}
	if first == nil {
		return nil
	}
	var stop *block
	for b := first; ; b = b.next {
		if b == nil || b.addr >= hi {
			stop = b
			break
		}
		if b.state != stateFree && b.state != stateUnmapped {
			return nil
		}
	}
	plan := growPlan{seg: seg, lo: lo, hi: hi, k: a.windowGranules(first, stop, lo, hi)}
	var m *block
	if plan.k == 0 {
		// Free blocks are coalesced: one free block holds the window.
		if first.state != stateFree || first.end() < hi {
			panic("allocator: internal error: a plan window without unmapped granules is not one free block")
		}
		a.removeFree(first)
		m = first
	} else {
		g := device.Ptr(a.gran)
		for b := first; b != stop; b = b.next {
			if b.state != stateUnmapped {
				continue
			}
			m0 := max(b.addr, seg.base+(lo-seg.base)/g*g)
			m1 := min(b.end(), seg.base+(hi-seg.base+g-1)/g*g)
			plan.ranges = append(plan.ranges, growRange{u: b, m0: m0, m1: m1})
		}
		a.flushQuick() // quick blocks are not stolen from
		hs, err := a.obtainGranules(plan.k, r, &plan)
		if err != nil {
			return nil
		}
		if m, err = a.mapInto(&plan, hs); err != nil {
			return nil
		}
	}
	// Cut [lo, hi) out of m; the parts before and after stay free.
	if m.addr < lo {
		left := m
		m = a.newBlock()
		m.addr, m.stream, m.seg, m.state, m.freedAt = lo, left.stream, seg, stateFree, left.freedAt
		m.size = uint64(left.end() - lo)
		a.linkAfter(left, m)
		left.size = uint64(lo - left.addr)
		a.blocks[lo] = m
		a.addFree(left)
	}
	if m.end() > hi {
		right := a.newBlock()
		right.addr, right.stream, right.seg, right.state, right.freedAt = hi, m.stream, seg, stateFree, m.freedAt
		right.size = uint64(m.end() - hi)
		a.linkAfter(m, right)
		m.size = r
		a.blocks[hi] = right
		a.addFree(right)
	}
	return m
}

// stealBeyondPlans unmaps free granules of plan segments that lie beyond
// their plan's span (memory the plan never uses: the segment was the
// stream's before it took the plan) and appends them to hs until it holds
// k. The window of the growth is left alone.
func (a *Allocator) stealBeyondPlans(hs []device.Handle, k int, plan *growPlan) ([]device.Handle, error) {
	p := a.plans
	g := device.Ptr(a.gran)
	streams := make([]device.Stream, 0, len(p.segs))
	for s := range p.segs {
		streams = append(streams, s)
	}
	slices.Sort(streams) // map order would make the steal order vary
	for _, s := range streams {
		if len(hs) >= k {
			break
		}
		seg := p.segs[s]
		start := seg.base + device.Ptr(p.shift[s])
		end := start + device.Ptr(alignUp(p.spans[s], a.gran))
		// Top down: the highest free granules first.
		var cands []*block
		for b := seg.head; b != nil; b = b.next {
			if b.state == stateFree && (b.end() > end || b.addr < start) && !plan.touches(b) && a.ready(b) {
				cands = append(cands, b)
			}
		}
		for i := len(cands) - 1; i >= 0 && len(hs) < k; i-- {
			b := cands[i]
			lo, hi := a.wholeGranules(b)
			// The part above the plan first, then the part below it
			// (carving keeps the lower part of b as b).
			for _, r := range [2][2]device.Ptr{{max(lo, end), hi}, {lo, min(hi, start)}} {
				if r[1] <= r[0] || len(hs) >= k {
					continue
				}
				take := min(k-len(hs), int((r[1]-r[0])/g))
				var err error
				if hs, err = a.unmapFreeRange(b, r[1]-device.Ptr(take)*g, r[1], hs, true); err != nil {
					return hs, err
				}
			}
		}
	}
	return hs, nil
}

// planUses indexes, for each granule of a plan segment, the times (t0) at
// which the plan's requests covering it are placed, in order.
type planUses [][]int32

// buildUses indexes the planned requests of stream s.
func (a *Allocator) buildUses(items []*planRec, span uint64) planUses {
	n := int(alignUp(span, a.gran) / a.gran)
	u := make(planUses, n)
	for _, it := range items {
		for gi := it.off / a.gran; gi <= (it.off+it.size-1)/a.gran && int(gi) < n; gi++ {
			u[gi] = append(u[gi], it.t0)
		}
	}
	for _, l := range u {
		slices.Sort(l)
	}
	return u
}

// nextUse is when granule gi is next placed into after time t (MaxInt32:
// not again in the step).
func (u planUses) nextUse(gi int, t int32) int32 {
	if gi >= len(u) {
		return math.MaxInt32
	}
	l := u[gi]
	i, _ := slices.BinarySearch(l, t+1)
	if i == len(l) {
		return math.MaxInt32
	}
	return l[i]
}

// stealPlanned unmaps free granules of plan segments, those whose next
// planned use is furthest first (Belady's rule: the plan knows the future),
// and appends them to hs until it holds k. The growth's window is left
// alone.
func (a *Allocator) stealPlanned(hs []device.Handle, k int, plan *growPlan) ([]device.Handle, error) {
	p := a.plans
	g := device.Ptr(a.gran)
	// Granules near the growth are left alone: those of its window and the
	// one on either side, and those bordering an unmapped block it maps
	// (unmapped there, they would merge with it).
	var wlo, whi device.Ptr
	if plan.seg != nil {
		base := plan.seg.base
		wlo = base + (plan.lo-base)/g*g - g
		whi = base + (plan.hi-base+g-1)/g*g + g
	}
	near := func(b *block, at device.Ptr) bool {
		if b.seg != plan.seg {
			return false
		}
		if at < whi && at+g > wlo {
			return true
		}
		for _, gr := range plan.ranges {
			if at+g == gr.u.addr || at == gr.u.end() {
				return true
			}
		}
		return false
	}
	// The n granules used again last: a min-heap of the best so far.
	n := k - len(hs)
	h := stealHeap(p.cands[:0])
	p.free.Ascend(func(b *block) bool {
		if !a.ready(b) {
			return true
		}
		lo, hi := a.wholeGranules(b)
		u := p.uses[b.stream]
		for at := lo; at < hi; at += g {
			if near(b, at) {
				continue
			}
			next := int32(math.MaxInt32)
			if rel := int64(at-b.seg.base) - int64(p.shift[b.stream]); rel >= 0 {
				next = u.nextUse(int(uint64(rel)/a.gran), p.t)
			}
			c := stealCand{b, at, next}
			if len(h) < n {
				heap.Push(&h, c)
			} else if len(h) > 0 && h.less(h[0], c) {
				h[0] = c
				heap.Fix(&h, 0)
			}
		}
		return true
	})
	cands := []stealCand(h)
	// Unmap by runs of adjacent granules of one block, from the top down
	// (carving a range keeps the block's lower part as the same block).
	slices.SortFunc(cands, func(x, y stealCand) int {
		switch {
		case x.at > y.at:
			return -1
		case x.at < y.at:
			return 1
		}
		return 0
	})
	var err error
	for i := 0; i < len(cands) && err == nil; {
		j := i + 1
		for j < len(cands) && cands[j].b == cands[i].b && cands[j].at+g == cands[j-1].at {
			j++
		}
		hs, err = a.unmapFreeRange(cands[i].b, cands[j-1].at, cands[i].at+g, hs, true)
		i = j
	}
	clear(cands)
	p.cands = cands[:0]
	return hs, err
}

// stealCand is a free plan granule at address at of block b, next placed
// into at time next.
type stealCand struct {
	b    *block
	at   device.Ptr
	next int32
}

// stealHeap is a min-heap of candidates: the root is the one to give up
// first when a better one comes (the soonest next use, then the lowest
// address).
type stealHeap []stealCand

func (h stealHeap) less(x, y stealCand) bool {
	if x.next != y.next {
		return x.next < y.next
	}
	return x.at < y.at
}
func (h stealHeap) Len() int           { return len(h) }
func (h stealHeap) Less(i, j int) bool { return h.less(h[i], h[j]) }
func (h stealHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *stealHeap) Push(x any)        { *h = append(*h, x.(stealCand)) }
func (h *stealHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// bestShift is where in seg a plan of span bytes should start: the whole
// number of granules at which the plan's range holds the most granules
// mapped now (the lowest such), so that the memory the step used is moved
// as little as possible.
func (a *Allocator) bestShift(seg *segment, span uint64) uint64 {
	n := len(seg.handles)
	w := int(alignUp(span, a.gran) / a.gran)
	if seg.mapped == 0 || w >= n {
		return 0
	}
	cur := 0
	for i := 0; i < w; i++ {
		if seg.handles[i] != 0 {
			cur++
		}
	}
	best, at := cur, 0
	for i := w; i < n; i++ {
		if seg.handles[i] != 0 {
			cur++
		}
		if seg.handles[i-w] != 0 {
			cur--
		}
		if cur > best {
			best, at = cur, i-w+1
		}
	}
	return uint64(at) * a.gran
}
