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
//
// Steps of several kinds (a GAN's discriminator and generator steps, an
// evaluation step between accumulation steps, two models each ending their
// own steps) keep a library of up to maxPlans plans, one per kind, sharing
// the stream's plan segment from the same offset. A boundary files the step
// just ended under the plan of its kind (the same requests, or all but one
// in planKeepMiss near their place in the plan) or makes a new plan; it
// never replaces a plan with a step of another kind. The next step's plan is
// chosen at its first large request: the predicted one (the kind that
// followed this kind last time; else, after a change of kind, the kind
// before; else the same kind) or a plan whose kind recurred, if it has an
// entry for that request at the step's start; none: best fit, in all the
// memory (the plan segments are ordinary ones until the boundary), as
// without boundaries. Requests are matched to entries near their place in
// the step (planDrift), so a step of another kind that begins alike misses
// soon; after planRepick misses in a row the choice is made again (another
// plan that matches the step so far better, or best fit when the plan in
// force matches less than half of it or of its last planRecent requests).
// Plans made from steps that never recur are not predicted after two new
// kinds in a row (steps that vary run best fit).

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

// storedPlan is one plan of the library: the placement of one kind of step.
// Every plan of a stream shares the stream's plan segment (steps do not
// overlap), each at its own shift, so that the granules one kind of step
// mapped serve the next kind without remapping.
type storedPlan struct {
	plan  []planRec // in request order
	spans map[device.Stream]uint64
	shift map[device.Stream]uint64
	uses  map[device.Stream]planUses
	byKey map[planKey]*planQueue
	need  uint64
	span  uint64
	used  int64 // the step it was last in force (LRU)
	// fit is what the step it was made from remapped under best fit (-1:
	// it ran under a plan); runs the steps it was in force (over the bound)
	fit  int64
	runs int
	// confirmed: a later step was of its kind (it recurs)
	confirmed bool
	after     *storedPlan // the kind of step that followed this one's last time
}

// maxPlans is how many plans the library keeps (steps of different kinds:
// a GAN's discriminator and generator steps, gradient accumulation with an
// evaluation forward, two models each ending their own steps).
const maxPlans = 4

// planRepick: after this many large requests in a row that missed the plan
// in force, the step's plan is chosen again (selectPlan), at most
// planRepicks times a step.
const (
	planRepick  = 3
	planRepicks = 8
)

// planRecent: a plan none of whose entries are near more than half of the
// step's last planRecent requests no longer matches the step (selectPlan).
const planRecent = 8

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

	// lib is the library of plans, one per kind of step seen; cur the one
	// in force (nil: best fit). pick: the step's first large request
	// chooses it (pred first, the plan that followed the last step's kind
	// last time); last is the kind of the step just ended; seen the keys
	// of the step's large requests so far (counts: planScore's scratch),
	// missRun the misses in a row and repicks the choices made again;
	// hidden: no plan matched the step, and the plan
	// segments are ordinary ones until the boundary (best fit uses their
	// memory); libBound the bound the plans were made for.
	lib    []*storedPlan
	cur    *storedPlan
	pred   *storedPlan
	last   *storedPlan
	pick   bool
	hidden bool
	seen   []planKey
	counts map[planKey]int
	nSeen  int // the step's large requests so far (seen holds up to maxPlanRecords)
	align  int // the step's index minus the plan's, at the last request placed
	// scoreAlign is planScore's alignment at the end of the requests seen,
	// scoreRecent its misses among the last planRecent
	scoreAlign, scoreRecent int
	missRun                 int
	repicks                 int
	libBound                uint64
	newRun                  int // the boundaries in a row whose step was a new kind

	plan   []planRec // the plan in force (cur's), in request order
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
	// keep is, per stream, the range [lo, hi) of its plan segment that some
	// plan of the library uses (stealBeyondPlans takes what lies outside).
	keep  map[device.Stream][2]uint64
	cands []stealCand           // stealPlanned's scratch
	free  *btree.BTreeG[*block] // free blocks of plan segments, by stream and address

	// fails counts the searches in a row that found no plan that fits;
	// skip the boundaries left before the next search.
	fails, skip int

	steps, built, reused, placedN, missedN, switches int64
	stepPlaced, stepMissed                           int64 // this step's
	lastSpan, lastNeed                               uint64
}

func newStepPlans() *stepPlans {
	return &stepPlans{
		fitRemaps: -1,
		segs:      make(map[device.Stream]*segment),
		spans:     make(map[device.Stream]uint64),
		shift:     make(map[device.Stream]uint64),
		keep:      make(map[device.Stream][2]uint64),
		counts:    make(map[planKey]int),
		free:      btree.NewG(btreeDegree, addrLess),
	}
}

// StepBoundary tells the allocator that a training step ended and the next
// begins (the program's optimizer step, or the end of a DTR region). With a
// budget known (SetBudget or the eviction threshold) and expandable
// segments, it turns the step just ended into a placement plan for the next
// steps of its kind (see the step-plan comment in plan.go and
// Config.NoStepPlan); otherwise it only counts steps. Allocations live
// across the boundary stay where they are.
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
	if bound != p.libBound {
		a.retirePlans() // made for another bound
		p.libBound = bound
	}
	a.unhidePlans()
	// What the step just ended remapped: best fit's cost when no plan was in
	// force; a plan over the bound that, past its first step (which moves
	// memory into its layout), remaps more than best fit did is dropped and
	// plans over the bound are not tried for a while.
	stepRemaps := a.cnt.remaps - p.remaps0
	dropped := false
	switch {
	case p.cur == nil:
		p.fitRemaps, p.activeSteps = stepRemaps, 0
	case p.cur.need > bound:
		p.activeSteps++
		p.cur.runs++
		// Best fit's cost for this kind of step: the step the plan was
		// made from, when it ran without a plan (kinds in turn remap
		// differently), else the last step without a plan.
		fit := p.fitRemaps
		if p.cur.fit >= 0 {
			fit = p.cur.fit
		}
		if p.cur.runs >= 2 && fit >= 0 && stepRemaps > fit {
			p.overFails = min(p.overFails+1, 6)
			p.overSkip = 1<<p.overFails - 1
			a.dropPlan(p.cur)
			dropped = true
		}
	default:
		p.activeSteps++
	}
	wasSkipping := p.overSkip > 0 && !dropped
	var kind *storedPlan
	if p.step > 0 && !p.overflow {
		built, planned := p.built, p.cur != nil || p.stepPlaced+p.stepMissed > 0
		kind = a.buildPlan(bound)
		switch {
		case p.built > built:
			p.newRun++ // a kind of step not seen before
			if !planned {
				kind.fit = stepRemaps
			}
		case kind != nil:
			p.newRun = 0
		}
	} else {
		a.retirePlans()
	}
	if wasSkipping {
		p.overSkip-- // one boundary without a plan over the bound
	}
	// The next step's plan: chosen at its first large request among the
	// library's, the one that followed this kind last time first.
	if p.last != nil && slices.Contains(p.lib, p.last) {
		p.last.after = kind
	}
	// Nothing known of what follows this kind: the same kind again (a
	// step that repeats), or, after a change of kind, the kind before (two
	// kinds in turn).
	prev := p.last
	p.last, p.pred = kind, kind
	switch {
	case kind != nil && kind.after != nil && slices.Contains(p.lib, kind.after):
		p.pred = kind.after
	case prev != nil && prev != kind && slices.Contains(p.lib, prev):
		p.pred = prev
	}
	a.usePlan(nil)
	p.pick = len(p.lib) > 0
	p.remaps0 = a.cnt.remaps
	p.stepPlaced, p.stepMissed = 0, 0
	p.step++
	p.recs = p.recs[:0]
	p.t = 0
	p.overflow = false
	p.liveRec = 0
	p.seen, p.nSeen, p.missRun, p.repicks, p.align = p.seen[:0], 0, 0, 0, 0
	p.otherPeak = uint64(a.st.cur(stAllocatedBytes))
	for _, sp := range p.lib {
		for _, q := range sp.byKey {
			q.next = 0
		}
	}
	p.budget = a.budgetInForce()
	// Exact splits while plans are kept or one may be made from the step:
	// the first recorded one, or one after a plan that fitted.
	// (Without a budget now - a region that registers its own at entry -
	// the step's first large request turns them on: recordAlloc.)
	p.wantExact = len(p.lib) > 0 || p.step == 1 || p.lastNeed <= bound
	p.exact = bound > 0 && p.wantExact
	if len(p.lib) > 0 && a.phys > bound {
		// Growth past the bound (a step that missed its plan): cached
		// memory outside the plans goes back down to the bound.
		a.flushQuick()
		a.refreshMarks(nil)
		if err := a.releaseCachedFrom(a.phys-bound, false); err != nil {
			a.log.Warn("allocator: releasing cached memory over the step plan's bound", zap.Error(err))
		}
		// Then what the plan segments hold beyond every plan's range (the
		// segment was the step's before it took a plan: U-Net at 30 % kept
		// 100 MiB mapped there, 1.127 x the budget, with a plan that fits).
		if a.phys > bound {
			k := int((a.phys - bound + a.gran - 1) / a.gran)
			hs, err := a.stealBeyondPlans(a.handles[:0], k, &growPlan{}, false)
			a.releaseHandles(hs)
			a.handles = hs[:0]
			if err != nil {
				a.log.Warn("allocator: releasing plan segment memory over the step plan's bound", zap.Error(err))
			}
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

// usePlan puts sp in force (nil: none).
func (a *Allocator) usePlan(sp *storedPlan) {
	p := a.plans
	p.cur = sp
	if sp == nil {
		p.active, p.plan, p.byKey, p.uses = false, nil, nil, nil
		p.spans, p.shift = map[device.Stream]uint64{}, map[device.Stream]uint64{}
		return
	}
	p.active = true
	p.plan, p.byKey, p.uses, p.spans, p.shift = sp.plan, sp.byKey, sp.uses, sp.spans, sp.shift
	sp.used = p.steps
}

// planScore counts the requests seen so far in the step that sp has no
// entry for near their place in the step (its entries of each key taken in
// turn; near: within planDrift of the request's index, so that a few
// requests added or dropped keep a plan's score low, while a step of
// another kind, whose sizes are met at other places, scores high): 0 when
// the step so far is the plan's.
func (a *Allocator) planScore(sp *storedPlan) int {
	p := a.plans
	clear(p.counts)
	miss, align := 0, 0
	p.scoreRecent = 0
	for i, k := range p.seen {
		q := sp.byKey[k]
		c := p.counts[k]
		for q != nil && c < len(q.idx) && int(q.idx[c]) < i-align-planDrift(i) {
			c++ // entries left behind (requests the step did not make)
		}
		if q == nil || c >= len(q.idx) || int(q.idx[c]) > i-align+planDrift(i) {
			p.counts[k] = c
			miss++
			if i >= len(p.seen)-planRecent {
				p.scoreRecent++
			}
			continue
		}
		align = i - int(q.idx[c])
		p.counts[k] = c + 1
	}
	p.scoreAlign = align
	return miss
}

// planDrift is how far from its place in the plan (shifted by the requests
// added or dropped before it: the last entry matched) the i-th request of a
// step may be met and still count as the plan's.
func planDrift(i int) int { return 4 + i/16 }

// choosePlan is the library's plan that best matches the step's requests
// so far: the fewest of them it has no entry for, then the plan in force,
// the predicted one, the most recently used. It returns the plan and its
// score.
func (a *Allocator) choosePlan() (*storedPlan, int) {
	p := a.plans
	var best *storedPlan
	bestScore := 0
	rank := func(sp *storedPlan) int {
		switch sp {
		case p.cur:
			return 2
		case p.pred:
			return 1
		}
		return 0
	}
	for _, sp := range p.lib {
		sc := a.planScore(sp)
		if best == nil || sc < bestScore ||
			(sc == bestScore && (rank(sp) > rank(best) || rank(sp) == rank(best) && sp.used > best.used)) {
			best, bestScore = sp, sc
		}
	}
	return best, bestScore
}

// selectPlan chooses the step's plan at its first large request (the
// predicted plan if it has an entry for the request, else the best match)
// and again after planRepick misses in a row (at most planRepicks times a
// step): a plan that matches the step's requests so far better than the one
// in force replaces it; when none covers half of them, the step runs best
// fit from there on. It reports whether a plan is in force.
func (a *Allocator) selectPlan() bool {
	p := a.plans
	k0 := p.seen[len(p.seen)-1]
	first := p.pick
	p.pick = false
	if first {
		// The predicted plan, else one whose kind of step recurred, with
		// an entry for the request at the step's start. A plan made from a
		// step that never came again is predicted only after at most one
		// new kind of step in a row: steps that vary (each a new kind)
		// run best fit, as without boundaries.
		var sp *storedPlan
		if p.pred != nil && (p.pred.confirmed || p.newRun < 2) && a.planScore(p.pred) == 0 {
			sp = p.pred
		}
		for _, x := range p.lib {
			if sp != p.pred && x.confirmed && (sp == nil || x.used > sp.used) && a.planScore(x) == 0 {
				sp = x
			}
		}
		if sp == nil {
			a.toBestFit()
			return false
		}
		a.usePlan(sp)
		return true
	}
	sp, sc := a.choosePlan()
	if sp == nil {
		a.toBestFit()
		return false
	}
	if sp != p.cur {
		curScore := len(p.seen) + 1
		if p.cur != nil {
			curScore = a.planScore(p.cur)
		}
		if sc < curScore {
			if p.cur != nil {
				p.switches++
			}
			a.usePlan(sp)
			// The requests so far count as the plan's first ones (their
			// blocks stay where they are).
			p.seen = p.seen[:len(p.seen)-1]
			a.planScore(sp)
			for k, q := range sp.byKey {
				q.next = p.counts[k]
			}
			p.align = p.scoreAlign
			p.seen = append(p.seen, k0)
			sc = a.planScore(sp)
		} else {
			sp, sc = p.cur, curScore
		}
	}
	sc = a.planScore(p.cur)
	if 2*sc > len(p.seen) || 2*p.scoreRecent > planRecent || 2*p.stepMissed > int64(len(p.seen)) {
		// A kind of step no plan knows: best fit, in all the memory.
		a.toBestFit()
		return false
	}
	return true
}

// toBestFit ends the plan in force for the rest of the step.
func (a *Allocator) toBestFit() {
	a.usePlan(nil)
	a.hidePlans()
}

// hidePlans makes the plan segments ordinary ones until the boundary: a step
// no plan matches runs best fit in all the cached memory, as without
// boundaries.
func (a *Allocator) hidePlans() {
	p := a.plans
	if p.hidden {
		return
	}
	p.hidden = true
	for _, s := range a.planStreams() {
		a.setPlan(p.segs[s], false)
	}
}

// unhidePlans makes the plan segments plan segments again.
func (a *Allocator) unhidePlans() {
	p := a.plans
	if !p.hidden {
		return
	}
	p.hidden = false
	a.flushQuick() // plan segments' blocks are never in the quick cache
	for _, s := range a.planStreams() {
		a.setPlan(p.segs[s], true)
	}
}

// planStreams lists the streams with a plan segment, in order.
func (a *Allocator) planStreams() []device.Stream {
	p := a.plans
	streams := make([]device.Stream, 0, len(p.segs))
	for s := range p.segs {
		streams = append(streams, s)
	}
	slices.Sort(streams) // map order would make the steal order vary
	return streams
}

// dropPlan removes sp from the library, and the plan segments no plan uses
// any more.
func (a *Allocator) dropPlan(sp *storedPlan) {
	p := a.plans
	p.lib = slices.DeleteFunc(p.lib, func(x *storedPlan) bool { return x == sp })
	for _, x := range p.lib {
		if x.after == sp {
			x.after = nil
		}
	}
	if p.cur == sp {
		a.usePlan(nil)
	}
	if p.pred == sp {
		p.pred = nil
	}
	if p.last == sp {
		p.last = nil
	}
	a.trimSegments()
}

// dropPlansOf removes the plans that place requests of stream s (its plan
// segment is gone or replaced).
func (a *Allocator) dropPlansOf(s device.Stream) {
	p := a.plans
	for _, sp := range slices.Clone(p.lib) {
		if _, ok := sp.spans[s]; ok {
			a.dropPlan(sp)
		}
	}
}

// trimSegments retires the plan segments no plan of the library uses and
// recomputes the ranges the plans keep.
func (a *Allocator) trimSegments() {
	p := a.plans
	clear(p.keep)
	for _, sp := range p.lib {
		for s, span := range sp.spans {
			lo, hi := sp.shift[s], sp.shift[s]+alignUp(span, a.gran)
			if r, ok := p.keep[s]; ok {
				lo, hi = min(lo, r[0]), max(hi, r[1])
			}
			p.keep[s] = [2]uint64{lo, hi}
		}
	}
	for _, s := range a.planStreams() {
		if _, ok := p.keep[s]; !ok {
			a.retirePlan(s)
		}
	}
}

// buildPlan files the recorded step in the library: the plan of its kind
// when one matches it (the plan in force when the step missed it for at
// most one large request in planKeepMiss), else a new plan, when it fits
// the bound (the least recently used beyond maxPlans goes). It returns the
// step's plan, or nil.
func (a *Allocator) buildPlan(bound uint64) *storedPlan {
	p := a.plans
	if bound == 0 || len(p.recs) == 0 {
		a.retirePlans()
		return nil
	}
	// The same requests as the plan in force, or nearly (at most one in
	// planKeepMiss of the step's large requests missed the plan): keep it.
	// Steps whose engine choices vary a little (op costs measured on the
	// device) would otherwise get a new layout, and move memory, each step.
	if sp := p.cur; sp != nil && a.planValid(sp) &&
		(samePlan(sp.plan, p.recs) || p.stepMissed*planKeepMiss <= p.stepPlaced) {
		p.reused++
		sp.confirmed = true
		return sp
	}
	for _, sp := range p.lib {
		if a.planValid(sp) && samePlan(sp.plan, p.recs) {
			p.reused++
			sp.confirmed = true
			return sp
		}
	}
	// A plan of the library whose step had nearly these requests (at most
	// one in planKeepMiss not near its place in the plan): the step was of
	// its kind.
	p.seen = p.seen[:0]
	for i := range p.recs {
		p.seen = append(p.seen, planKey{p.recs[i].size, p.recs[i].stream})
	}
	var near *storedPlan
	nearScore := 0
	for _, sp := range p.lib {
		if !a.planValid(sp) {
			continue
		}
		if sc := a.planScore(sp); near == nil || sc < nearScore {
			near, nearScore = sp, sc
		}
	}
	if near != nil && nearScore*planKeepMiss <= len(p.recs) {
		p.reused++
		near.confirmed = true
		return near
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
		return nil // the library's plans stay
	}
	// A plan segment must be empty to take a new plan (and big enough);
	// replacing it drops the plans that used it.
	for _, s := range streams {
		if seg := p.segs[s]; seg != nil && (!segmentIdle(seg) || seg.size < spans[s]) {
			a.dropPlansOf(s)
			a.retirePlan(s)
		}
	}
	if len(p.lib) >= maxPlans {
		lru := p.lib[0]
		for _, sp := range p.lib {
			if sp.used < lru.used {
				lru = sp
			}
		}
		a.dropPlan(lru)
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
			return nil
		}
		p.segs[s] = seg
	}
	sp := &storedPlan{
		plan:  next,
		spans: spans,
		shift: make(map[device.Stream]uint64, len(streams)),
		uses:  make(map[device.Stream]planUses, len(streams)),
		byKey: make(map[planKey]*planQueue),
		need:  need,
		used:  p.steps,
		fit:   -1,
	}
	for _, s := range streams {
		// The library's plans of a stream start where the first one does
		// (they overlap: what one kind of step mapped serves the others).
		if r, ok := p.keep[s]; ok && r[0]+alignUp(spans[s], a.gran) <= p.segs[s].size {
			sp.shift[s] = r[0]
		} else {
			sp.shift[s] = a.bestShift(p.segs[s], spans[s])
		}
		sp.uses[s] = a.buildUses(byStream[s], spans[s])
		sp.span += spans[s]
	}
	for i := range next {
		k := planKey{next[i].size, next[i].stream}
		q := sp.byKey[k]
		if q == nil {
			q = &planQueue{}
			sp.byKey[k] = q
		}
		q.idx = append(q.idx, int32(i))
	}
	p.fails, p.skip = 0, 0
	p.lib = append(p.lib, sp)
	a.trimSegments()
	p.built++
	p.lastSpan = sp.span
	return sp
}

// planValid reports whether every stream of sp still has its plan segment.
func (a *Allocator) planValid(sp *storedPlan) bool {
	for s := range sp.spans {
		if a.plans.segs[s] == nil {
			return false
		}
	}
	return true
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
// 30 % of its peak, whose best plan before the search's restarts needed
// 1.035 x the bound, remapped 50-60 granules per step instead of best fit's
// 1,065-1,075 (with the restarts its plan fits).
const planOver = 1.2

// planSearchMargin: a plan search runs only when the first plan needs at
// most this times the bound.
const planSearchMargin = 1.25

// planTries caps the orders a plan search tries.
const planTries = 256

// planRestarts and planRestartWork cap the search's restarts with noisy
// blame (searchPlan), run when its first rounds found no plan that fits:
// at most planRestarts restarts of up to planTries rounds, and at most
// planRestartWork pair checks in all. Measured on U-Net at 30 % (317
// requests, 58 ms a restart here): 5 restarts in 48 find a plan that fits
// (1.087-1.102 x the step's peak of live bytes); the deterministic rounds
// stop at 1.142 x. 32 restarts find one with probability ~0.97 if each
// has that chance; a search that finds nothing costs ~1.9 s for U-Net
// (then the search backs off, see buildPlan).
const (
	planRestarts    = 32
	planRestartWork = 8e8
)

// searchRestarts is planRestarts; the tests of plans over the bound set it
// to 0 (their churn fits the bound with the restarts).
var searchRestarts = planRestarts

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
	// Restarts with noisy blame: the rounds above settle into a cycle of
	// orders (U-Net at 30 %: 2,646 MiB from round ~100 to round 2,000,
	// target 2,553). Each restart begins again from largest first, blames
	// the requests that end above the target (or in the top 5 %, when that
	// band lies lower) by 1 + a uniform draw, so that ties between equally
	// blamed requests break differently, and stops at the first plan that
	// fits. Seeds are the restart's number: the same step gets the same plan.
	rounds := min(planTries, max(1, int(planRestartWork/(n*n))))
	for r := 1; r <= searchRestarts && best > target && float64(r*rounds)*n*n <= planRestartWork; r++ {
		rng := rand.New(rand.NewSource(int64(r)))
		order = slices.Clone(items)
		slices.SortStableFunc(order, bySize)
		noisy := make(map[*planRec]float64, len(order))
		for i := 0; i < rounds && best > target; i++ {
			sp := placeGreedy(order, false)
			keep(sp)
			cut := min(sp-sp/20, target)
			for _, x := range order {
				if x.off+x.size > cut {
					noisy[x] += 1 + rng.Float64()
				}
			}
			slices.SortStableFunc(order, func(x, y *planRec) int {
				if bx, by := noisy[x], noisy[y]; bx != by {
					if bx > by {
						return -1
					}
					return 1
				}
				return bySize(x, y)
			})
		}
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
	p.lib, p.pred, p.last, p.pick, p.hidden = nil, nil, nil, false, false
	clear(p.keep)
	a.usePlan(nil)
}

// retirePlan turns stream s's plan segment into an ordinary one: its free
// blocks move to the large pool's tree.
func (a *Allocator) retirePlan(s device.Stream) {
	p := a.plans
	seg := p.segs[s]
	delete(p.segs, s)
	delete(p.keep, s)
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
	p.nSeen++
	if len(p.seen) < maxPlanRecords {
		p.seen = append(p.seen, planKey{r, s})
	}
	if p.pick || (p.missRun >= planRepick && p.repicks < planRepicks) {
		if !p.pick {
			p.repicks++
		}
		p.missRun = 0
		if !a.selectPlan() {
			return nil
		}
	}
	b := a.planTake(r, s)
	if b == nil {
		p.missRun++
		p.missedN++
		p.stepMissed++
		return nil
	}
	p.missRun = 0
	p.placedN++
	p.stepPlaced++
	return b
}

// planTake places the request by the plan in force, or returns nil.
func (a *Allocator) planTake(r uint64, s device.Stream) *block {
	p := a.plans
	q := p.byKey[planKey{r, s}]
	i := p.nSeen - 1
	for q != nil && q.next < len(q.idx) && int(q.idx[q.next]) < i-p.align-planDrift(i) {
		q.next++ // entries left behind (requests the step did not make)
	}
	if q == nil || q.next >= len(q.idx) || int(q.idx[q.next]) > i-p.align+planDrift(i) {
		return nil // none near this place: another kind of step
	}
	p.align = i - int(q.idx[q.next])
	e := &p.plan[q.idx[q.next]]
	q.next++
	seg := p.segs[s]
	if !e.placed || seg == nil {
		return nil
	}
	return a.takeRange(seg, seg.base+device.Ptr(p.shift[s]+e.off), r)
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
// k, counting them as remapped when remap is set. The window of the growth
// is left alone.
func (a *Allocator) stealBeyondPlans(hs []device.Handle, k int, plan *growPlan, remap bool) ([]device.Handle, error) {
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
		start := seg.base + device.Ptr(p.keep[s][0])
		end := seg.base + device.Ptr(p.keep[s][1])
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
				if hs, err = a.unmapFreeRange(b, r[1]-device.Ptr(take)*g, r[1], hs, remap); err != nil {
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

// dropSegment forgets stream s's plan segment (its memory was returned) and
// the plans that used it.
func (p *stepPlans) dropSegment(s device.Stream) {
	delete(p.segs, s)
	delete(p.keep, s)
	keep := p.lib[:0]
	for _, sp := range p.lib {
		if _, ok := sp.spans[s]; !ok {
			keep = append(keep, sp)
		}
	}
	clear(p.lib[len(keep):])
	p.lib = keep
	for _, sp := range p.lib {
		if sp.after != nil && !slices.Contains(p.lib, sp.after) {
			sp.after = nil
		}
	}
	if p.cur != nil && !slices.Contains(p.lib, p.cur) {
		p.cur, p.active, p.plan, p.byKey, p.uses = nil, false, nil, nil, nil
		p.spans, p.shift = map[device.Stream]uint64{}, map[device.Stream]uint64{}
	}
	if p.pred != nil && !slices.Contains(p.lib, p.pred) {
		p.pred = nil
	}
	if p.last != nil && !slices.Contains(p.lib, p.last) {
		p.last = nil
	}
	if len(p.lib) == 0 {
		p.pick = false
	}
}
