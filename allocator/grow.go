package allocator

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"go.uber.org/zap"

	"github.com/memscale/memscale/device"
)

// growPlan says where an expandable segment grows: a window [lo, hi) of
// r bytes of one segment that holds no block in use (only cached free
// blocks and unmapped address space), and the unmapped granule ranges inside
// it that get memory.
type growPlan struct {
	seg    *segment
	lo, hi device.Ptr
	ranges []growRange
	k      int // granules to map
}

// growRange is granules [m0, m1) of the unmapped block u.
type growRange struct {
	u      *block
	m0, m1 device.Ptr
}

// growVMM maps new granules into an expandable segment of pool pk and stream
// s (creating the segment if none has room) and returns the detached free
// block, of at least r bytes, that they extend.
func (a *Allocator) growVMM(pk poolKind, s device.Stream, r uint64) (*block, error) {
	a.flushQuick()
	plan, ok := a.planGrow(pk, s, r)
	if !ok {
		if err := a.newSegment(pk, s, r); err != nil {
			return nil, err
		}
		if plan, ok = a.planGrow(pk, s, r); !ok {
			return nil, fmt.Errorf("allocator: internal error: no room for %d bytes in a new segment", r)
		}
	}
	hs, err := a.obtainGranules(plan.k, r, &plan)
	if err != nil {
		return nil, err
	}
	return a.mapInto(&plan, hs)
}

// planGrow picks, in the expandable segments of pool pk and stream s, the
// window of r bytes that holds no block in use and needs the fewest new
// granules: a window may span several cached free blocks and unmapped
// stretches (the holes granules were taken from), and only the unmapped
// granules inside it are mapped. Ties go to the lowest address.
func (a *Allocator) planGrow(pk poolKind, s device.Stream, r uint64) (growPlan, bool) {
	best := growPlan{k: math.MaxInt}
	for _, seg := range a.segs[segKey{pk, s}] {
		if !seg.expandable || seg.plan {
			continue
		}
		// Stretches of free and unmapped blocks, in address order.
		var first *block
		for b := seg.head; ; b = b.next {
			if b != nil && (b.state == stateUnmapped || (b.state == stateFree && !b.quick)) {
				if first == nil {
					first = b
				}
				continue
			}
			if first != nil {
				a.planStretch(&best, seg, first, b, r)
				first = nil
			}
			if b == nil {
				break
			}
		}
	}
	if best.k == math.MaxInt {
		return growPlan{}, false
	}
	return best, true
}

// planStretch considers the windows of r bytes in the stretch of free and
// unmapped blocks [first, stop) of seg and keeps in best the one needing the
// fewest new granules. A window starts where a block starts or ends where a
// block ends: between those the count only changes at granule edges inside
// unmapped blocks, where it is no lower.
func (a *Allocator) planStretch(best *growPlan, seg *segment, first, stop *block, r uint64) {
	start := first.addr
	var end device.Ptr
	hasUnmapped := false
	for b := first; b != stop; b = b.next {
		end = b.end()
		hasUnmapped = hasUnmapped || b.state == stateUnmapped
	}
	if !hasUnmapped || uint64(end-start) < r {
		return
	}
	found := false
	try := func(lo device.Ptr) {
		if lo < start || lo+device.Ptr(r) > end {
			return
		}
		if k := a.windowGranules(first, stop, lo, lo+device.Ptr(r)); k < best.k || (k == best.k && best.seg == seg && lo < best.lo) {
			*best = growPlan{seg: seg, lo: lo, hi: lo + device.Ptr(r), k: k, ranges: best.ranges[:0]}
			found = true
		}
	}
	for b := first; b != stop; b = b.next {
		try(b.addr)
		if b.end() >= start+device.Ptr(r) {
			try(b.end() - device.Ptr(r))
		}
	}
	if !found {
		return
	}
	// Fill in the ranges of the window kept.
	best.ranges = best.ranges[:0]
	g := device.Ptr(a.gran)
	for b := first; b != stop; b = b.next {
		if b.state != stateUnmapped || b.end() <= best.lo || b.addr >= best.hi {
			continue
		}
		m0 := max(b.addr, seg.base+(best.lo-seg.base)/g*g)
		m1 := min(b.end(), seg.base+(best.hi-seg.base+g-1)/g*g)
		best.ranges = append(best.ranges, growRange{u: b, m0: m0, m1: m1})
	}
}

// touches reports whether stealing granules from the free block b would
// change the plan: b lies in the window, or borders one of the unmapped
// blocks to be mapped (the granules taken from b would merge with it).
func (p *growPlan) touches(b *block) bool {
	if b.seg != p.seg {
		return false
	}
	if b.addr < p.hi && b.end() > p.lo {
		return true
	}
	for _, gr := range p.ranges {
		if b.next == gr.u || b.prev == gr.u {
			return true
		}
	}
	return false
}

// windowGranules counts the unmapped granules of the stretch [first, stop)
// that the window [lo, hi) touches.
func (a *Allocator) windowGranules(first, stop *block, lo, hi device.Ptr) int {
	g := device.Ptr(a.gran)
	base := first.seg.base
	glo := base + (lo-base)/g*g
	ghi := base + (hi-base+g-1)/g*g
	k := 0
	for b := first; b != stop && b.addr < ghi; b = b.next {
		if b.state != stateUnmapped || b.end() <= glo {
			continue
		}
		k += int((min(b.end(), ghi) - max(b.addr, glo)) / g)
	}
	return k
}

// newSegment reserves address space for a new expandable segment of pool pk
// and stream s, big enough for r bytes.
func (a *Allocator) newSegment(pk poolKind, s device.Stream, r uint64) error {
	va := a.vaSize
	if need := alignUp(r, a.gran); need > va {
		va = need
	}
	base, err := a.dev.ReserveAddress(va)
	if err != nil {
		return &shortError{short: r, cause: fmt.Errorf("reserving %d bytes of address space: %w", va, err)}
	}
	seg := &segment{
		base:       base,
		size:       va,
		pool:       pk,
		stream:     s,
		st:         a.streamState(s),
		expandable: true,
		handles:    make([]device.Handle, va/a.gran),
	}
	u := a.newBlock()
	u.addr, u.size, u.stream, u.seg, u.state = base, va, s, seg, stateUnmapped
	seg.head = u
	a.pools[pk].unmapped.ReplaceOrInsert(u)
	a.addSegment(seg)
	a.virt += va
	a.log.Debug("allocator: expandable segment reserved", zap.Stringer("pool", pk),
		zap.Uintptr("stream", uintptr(s)), zap.Uintptr("base", uintptr(base)), zap.Uint64("size", va))
	return nil
}

// obtainGranules gathers k physical granules for a segment growing by a
// request of r bytes at u: new ones while reserved memory stays under the
// cache bound, then cached free granules whose streams are done with them,
// then new ones up to the limit, then the free granules beside the window.
func (a *Allocator) obtainGranules(k int, r uint64, plan *growPlan) ([]device.Handle, error) {
	g := a.gran
	hs := a.handles[:0]
	room := func() int {
		if a.limit <= a.phys {
			return 0
		}
		return int((a.limit - a.phys) / g)
	}
	soft := room()
	if bound := a.cacheBound(r); bound >= 0 {
		if uint64(bound) > a.phys {
			soft = min(soft, int((uint64(bound)-a.phys)/g))
		} else {
			soft = 0
		}
	}
	var cause error
	var err error
	hs, cause, err = a.createGranules(hs, min(k, soft))
	if err == nil && len(hs) < k {
		hs, err = a.steal(hs, k, plan)
	}
	if err == nil && len(hs) < k && cause == nil {
		hs, cause, err = a.createGranules(hs, min(k-len(hs), room()))
	}
	if err == nil && len(hs) < k {
		// At the limit, the growth's own neighbours: rather than fail,
		// cut the free run its window borders (never sooner: moving
		// memory from beside the window into it only keeps the bound).
		hs, err = a.stealNearWindow(hs, k, plan)
	}
	if err != nil {
		a.releaseHandles(hs)
		return nil, err
	}
	if len(hs) < k {
		short := uint64(k-len(hs)) * g
		a.releaseHandles(hs)
		return nil, &shortError{short: short, cause: cause}
	}
	return hs, nil
}

// cacheBound returns the reserved bytes up to which a growth serving a
// request of r bytes creates new granules before it remaps cached ones: the
// high-water mark of allocated bytes (counting r) plus max(CacheSlack x that
// mark, 4 granules), or, when a DTR budget is known and larger, the budget
// plus BudgetSlack x the budget. The limit applies on top. -1 means no bound
// below the limit (negative CacheSlack).
func (a *Allocator) cacheBound(r uint64) int64 {
	if a.slack < 0 {
		return -1
	}
	hwm := max(uint64(a.st.cur(stAllocatedBytes))+r, a.hwm)
	extra := max(uint64(a.slack*float64(hwm)), uint64(minCacheGranules)*a.gran)
	bound := hwm + extra
	if b := a.budgetInForce(); b > 0 && a.budgetSlack >= 0 {
		bound = max(bound, b+uint64(a.budgetSlack*float64(b)))
	}
	return int64(min(bound, uint64(math.MaxInt64)))
}

// createGranules appends up to n new granules to hs. cause is the device's
// out-of-memory error that stopped it; err any other failure.
func (a *Allocator) createGranules(hs []device.Handle, n int) (_ []device.Handle, cause, err error) {
	for i := 0; i < n; i++ {
		h, e := a.dev.CreatePhysical(a.gran)
		if e != nil {
			e = fmt.Errorf("CreatePhysical(%d): %w", a.gran, e)
			if errors.Is(e, device.ErrOutOfMemory) {
				return hs, e, nil
			}
			return hs, nil, e
		}
		a.phys += a.gran
		a.cnt.deviceAllocs++
		hs = append(hs, h)
	}
	return hs, nil, nil
}

// releaseHandles returns unmapped granules to the device.
func (a *Allocator) releaseHandles(hs []device.Handle) {
	for _, h := range hs {
		if err := a.dev.ReleasePhysical(h); err != nil {
			a.log.Warn("allocator: releasing physical memory", zap.Uintptr("handle", uintptr(h)), zap.Error(err))
			continue
		}
		a.phys -= a.gran
		a.cnt.deviceFrees++
	}
	clear(hs)
}

// wholeGranules returns the granule-aligned range inside the free block b.
func (a *Allocator) wholeGranules(b *block) (lo, hi device.Ptr) {
	base, g := b.seg.base, a.gran
	lo = base + device.Ptr(alignUp(uint64(b.addr-base), g))
	hi = base + device.Ptr(alignDown(uint64(b.end()-base), g))
	if hi < lo {
		hi = lo
	}
	return lo, hi
}

// steal unmaps cached free granules whose streams have finished with them
// and appends them to hs until it holds k. The free blocks inside the
// planned window, which the growth will use, are left alone. The smallest
// free blocks with whole granules go first: they are the fragments that
// serve the fewest requests, while the large free runs serve the large
// requests that would otherwise miss (and remap) in turn.
func (a *Allocator) steal(hs []device.Handle, k int, plan *growPlan) ([]device.Handle, error) {
	a.refreshMarks(plan.seg.st)
	if a.plans != nil && a.plans.active {
		// First the granules of plan segments beyond their plan's span,
		// which the plan never uses.
		var err error
		if hs, err = a.stealBeyondPlans(hs, k, plan, true); err != nil || len(hs) >= k {
			return hs, err
		}
	}
	need := k - len(hs)
	cands := a.scratch[:0]
	found := 0
	for _, pk := range [...]poolKind{largePool, smallPool} {
		for _, st := range a.streamList {
			if found >= need {
				break
			}
			a.pivot = block{stream: st.s, size: a.gran}
			a.pools[pk].free.AscendGreaterOrEqual(&a.pivot, func(b *block) bool {
				if b.stream != st.s {
					return false
				}
				if plan.touches(b) || !a.ready(b) {
					return true
				}
				lo, hi := a.wholeGranules(b)
				if n := int(uint64(hi-lo) / a.gran); n > 0 {
					cands = append(cands, b)
					found += n
				}
				return found < need
			})
		}
	}
	var err error
	for _, b := range cands {
		if len(hs) >= k || err != nil {
			break
		}
		lo, hi := a.wholeGranules(b)
		take := min(k-len(hs), int(uint64(hi-lo)/a.gran))
		hs, err = a.unmapFree(b, take, hs, true)
	}
	clear(cands)
	a.scratch = cands[:0]
	if err == nil && len(hs) < k && a.plans != nil && a.plans.free.Len() > 0 {
		// Last, the free granules of step plans: those whose next planned
		// use is furthest (a later planned request maps them again).
		hs, err = a.stealPlanned(hs, k, plan)
	}
	return hs, err
}

// stealNearWindow unmaps the whole free granules of the growth's segment
// that lie outside its window, and appends them to hs until it holds k. The
// steal leaves alone the free blocks that touch the window (one straddling
// its edge, one bordering an unmapped block it maps), and so, at the limit,
// a growth whose window cuts a large free run failed although the part of
// that run outside the window held the granules it lacked (issue 32, soak
// seed 1380: 74 such granules, 25 missing, a spurious out-of-memory). With
// this pass a growth whose streams are done with the cache fails only when
// the granules live blocks touch plus the window's exceed the limit. The
// granules furthest from the window go first, so that what stays free joins
// the grown block. Unmapped next to an
// unmapped block the plan maps, they merge with it, so the plan's ranges
// are looked up again.
func (a *Allocator) stealNearWindow(hs []device.Handle, k int, plan *growPlan) ([]device.Handle, error) {
	seg := plan.seg
	if seg == nil {
		return hs, nil
	}
	g := device.Ptr(a.gran)
	glo := seg.base + (plan.lo-seg.base)/g*g
	ghi := seg.base + (plan.hi-seg.base+g-1)/g*g
	// dist is how far the block b lies from the window.
	dist := func(b *block) device.Ptr {
		if b.addr >= ghi {
			return b.addr - ghi
		}
		return glo - min(b.end(), glo)
	}
	cands := a.scratch[:0]
	for b := seg.head; b != nil; b = b.next {
		if b.state != stateFree || b.quick || !a.ready(b) {
			continue
		}
		if lo, hi := a.wholeGranules(b); hi > lo && (lo < glo || hi > ghi) {
			cands = append(cands, b)
		}
	}
	sort.SliceStable(cands, func(i, j int) bool { return dist(cands[i]) > dist(cands[j]) })
	var err error
	took := false
	for _, b := range cands {
		if len(hs) >= k || err != nil {
			break
		}
		lo, hi := a.wholeGranules(b)
		// Above the window from the top down, then below it from the bottom
		// up (carving keeps the lower part of b as b).
		if up0 := max(lo, ghi); up0 < hi {
			take := min(k-len(hs), int((hi-up0)/g))
			hs, err = a.unmapFreeRange(b, hi-device.Ptr(take)*g, hi, hs, true)
			took = true
		}
		if dn1 := min(hi, glo); lo < dn1 && len(hs) < k && err == nil {
			take := min(k-len(hs), int((dn1-lo)/g))
			hs, err = a.unmapFreeRange(b, lo, lo+device.Ptr(take)*g, hs, true)
			took = true
		}
	}
	clear(cands)
	a.scratch = cands[:0]
	if took {
		a.relocateRanges(plan)
	}
	return hs, err
}

// relocateRanges points each range of plan at the unmapped block that now
// holds its granules (unmapping next to one merges the two).
func (a *Allocator) relocateRanges(plan *growPlan) {
	t := a.pools[plan.seg.pool].unmapped
	for i := range plan.ranges {
		gr := &plan.ranges[i]
		a.pivot = block{stream: plan.seg.stream, addr: gr.m0}
		gr.u = nil
		t.DescendLessOrEqual(&a.pivot, func(b *block) bool {
			if b.seg == plan.seg && b.end() >= gr.m1 {
				gr.u = b
			}
			return false
		})
		if gr.u == nil {
			panic(fmt.Sprintf("allocator: internal error: the granules [%#x, %#x) of a growth are no longer unmapped", uintptr(gr.m0), uintptr(gr.m1)))
		}
	}
}

// unmapFree unmaps the top take whole granules of the cached free block b
// and appends their handles to hs. The unmapped range becomes an unmapped
// block; what is left of b stays cached.
func (a *Allocator) unmapFree(b *block, take int, hs []device.Handle, remap bool) ([]device.Handle, error) {
	_, hi := a.wholeGranules(b)
	return a.unmapFreeRange(b, hi-device.Ptr(take)*device.Ptr(a.gran), hi, hs, remap)
}

// unmapFreeRange unmaps the whole granules [lo, hi) of the cached free
// block b and appends their handles to hs; see unmapFree.
func (a *Allocator) unmapFreeRange(b *block, lo, hi device.Ptr, hs []device.Handle, remap bool) ([]device.Handle, error) {
	seg, g := b.seg, device.Ptr(a.gran)
	take := int((hi - lo) / g)
	a.removeFree(b)
	cut := hi
	var err error
	// One Unmap for the whole run of granules (cuMemUnmap accepts several
	// adjacent whole mappings; PyTorch unmaps handle by handle).
	a.cnt.unmapCalls++
	if e := a.dev.Unmap(lo, uint64(hi-lo)); e != nil {
		err = fmt.Errorf("unmapping %d bytes at %#x: %w", uint64(hi-lo), uintptr(lo), e)
	} else {
		for p := lo; p < hi; p += g {
			i := (p - seg.base) / g
			hs = append(hs, seg.handles[i])
			seg.handles[i] = 0
		}
		n := uint64(hi - lo)
		seg.mapped -= n
		a.st.add(stReservedBytes, seg.pool, -int64(n))
		a.cnt.unmaps += int64(take)
		if remap {
			a.cnt.remaps += int64(take)
		}
		cut = lo
	}
	if a.trace != nil && cut < hi {
		a.trace.add(actSegmentUnmap, cut, uint64(hi-cut), b.stream)
	}
	a.carveUnmapped(b, cut, hi)
	return hs, err
}

// carveUnmapped turns [lo, hi) of the detached free block b into an unmapped
// block; the parts of b before and after it go back to the tree.
func (a *Allocator) carveUnmapped(b *block, lo, hi device.Ptr) {
	if lo == hi {
		a.addFree(b)
		return
	}
	end := b.end()
	var right *block
	if hi < end {
		right = a.newBlock()
		right.addr, right.size, right.stream, right.seg = hi, uint64(end-hi), b.stream, b.seg
		right.state, right.freedAt = stateFree, b.freedAt
		a.linkAfter(b, right)
		b.size = uint64(hi - b.addr)
		a.blocks[hi] = right
	}
	m := b
	if lo == b.addr {
		delete(a.blocks, b.addr)
		b = nil
	} else {
		m = a.newBlock()
		m.addr, m.stream, m.seg = lo, b.stream, b.seg
		a.linkAfter(b, m)
		b.size = uint64(lo - b.addr)
	}
	m.size, m.state, m.freedAt, m.req = uint64(hi-lo), stateUnmapped, 0, 0
	if b != nil {
		a.addFree(b)
	}
	if right != nil {
		a.addFree(right)
	}
	a.addUnmapped(m)
}

// linkAfter inserts n after b in b's segment.
func (a *Allocator) linkAfter(b, n *block) {
	n.prev = b
	n.next = b.next
	if b.next != nil {
		b.next.prev = n
	}
	b.next = n
}

// addUnmapped merges the detached unmapped block m with unmapped neighbours
// and indexes the result.
func (a *Allocator) addUnmapped(m *block) {
	t := a.pools[m.seg.pool].unmapped
	if p := m.prev; p != nil && p.state == stateUnmapped {
		t.Delete(p)
		p.size += m.size
		p.next = m.next
		if m.next != nil {
			m.next.prev = p
		}
		a.dropBlock(m)
		m = p
	}
	if n := m.next; n != nil && n.state == stateUnmapped {
		t.Delete(n)
		m.size += n.size
		m.next = n.next
		if n.next != nil {
			n.next.prev = m
		}
		a.dropBlock(n)
	}
	t.ReplaceOrInsert(m)
}

// mapInto maps hs at the planned granules (one MapRange per unmapped
// stretch of the window: access is set once per range) and returns the
// detached free block, coalesced with its free neighbours, that now covers
// the window. If a MapRange fails, the handles not mapped are released, the
// ranges mapped before stay as cached memory, and the error is returned.
func (a *Allocator) mapInto(plan *growPlan, hs []device.Handle) (*block, error) {
	g := device.Ptr(a.gran)
	var m *block
	rest := hs
	for i, gr := range plan.ranges {
		n := int((gr.m1 - gr.m0) / g)
		if err := a.mapRange(gr, rest[:n]); err != nil {
			a.releaseHandles(rest)
			clear(hs)
			a.handles = hs[:0]
			if m != nil {
				a.addFree(m)
			}
			return nil, err
		}
		rest = rest[n:]
		if m != nil {
			a.addFree(m)
		}
		m = a.coalesce(a.carveMapped(gr.u, gr.m0, gr.m1))
		if i < len(plan.ranges)-1 && m.end() > plan.ranges[i+1].u.addr {
			panic("allocator: internal error: growth ranges overlap")
		}
	}
	clear(hs)
	a.handles = hs[:0]
	if m == nil || m.addr > plan.lo || m.end() < plan.hi {
		panic(fmt.Sprintf("allocator: internal error: the growth does not cover its window [%#x, %#x)", uintptr(plan.lo), uintptr(plan.hi)))
	}
	return m, nil
}

// mapRange maps hs at the granules gr (one MapRange). On failure nothing of
// it is mapped.
func (a *Allocator) mapRange(gr growRange, hs []device.Handle) error {
	seg, g := gr.u.seg, device.Ptr(a.gran)
	n := uint64(len(hs)) * a.gran
	if err := a.dev.MapRange(gr.m0, a.gran, hs); err != nil {
		return fmt.Errorf("mapping %d bytes at %#x: %w", n, uintptr(gr.m0), err)
	}
	a.pools[seg.pool].unmapped.Delete(gr.u)
	first := (gr.m0 - seg.base) / g
	for i, h := range hs {
		seg.handles[first+device.Ptr(i)] = h
	}
	seg.mapped += n
	a.st.add(stReservedBytes, seg.pool, int64(n))
	a.cnt.maps += int64(len(hs))
	a.cnt.mapCalls++
	if a.trace != nil {
		a.trace.add(actSegmentMap, gr.m0, n, gr.u.stream)
	}
	return nil
}

// carveMapped turns [lo, hi) of the detached unmapped block u into a free
// block (returned detached); the rest of u stays unmapped.
func (a *Allocator) carveMapped(u *block, lo, hi device.Ptr) *block {
	t := a.pools[u.seg.pool].unmapped
	end := u.end()
	if hi < end {
		r := a.newBlock()
		r.addr, r.size, r.stream, r.seg, r.state = hi, uint64(end-hi), u.stream, u.seg, stateUnmapped
		a.linkAfter(u, r)
		u.size = uint64(hi - u.addr)
		t.ReplaceOrInsert(r)
	}
	m := u
	if lo != u.addr {
		m = a.newBlock()
		m.addr, m.stream, m.seg = lo, u.stream, u.seg
		a.linkAfter(u, m)
		u.size = uint64(lo - u.addr)
		t.ReplaceOrInsert(u)
	}
	m.size, m.state, m.freedAt, m.req = uint64(hi-lo), stateFree, 0, 0
	a.blocks[m.addr] = m
	return m
}

// releaseCached returns up to max bytes of cached memory that no stream
// still uses to the device, largest blocks first: free granules of
// expandable segments, or whole free Alloc segments. With max =
// math.MaxUint64 it also returns the address space of segments left empty.
func (a *Allocator) releaseCached(max uint64) error {
	return a.releaseCachedFrom(max, true)
}

// releaseCachedFrom is releaseCached; plans says whether the free memory of
// step-plan segments may go too.
func (a *Allocator) releaseCachedFrom(max uint64, plans bool) error {
	cands := a.scratch[:0]
	visit := func(b *block) bool {
		if !a.ready(b) {
			return true
		}
		if a.vmm {
			if lo, hi := a.wholeGranules(b); hi > lo {
				cands = append(cands, b)
			}
		} else if !b.isSplit() {
			cands = append(cands, b)
		}
		return true
	}
	for pk := range a.pools {
		a.pools[pk].free.Ascend(visit)
	}
	if a.plans != nil && plans {
		a.plans.free.Ascend(visit)
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].size > cands[j].size })
	var released uint64
	var errs []error
	for _, b := range cands {
		if released >= max {
			break
		}
		if a.vmm {
			lo, hi := a.wholeGranules(b)
			n := int(uint64(hi-lo) / a.gran)
			hs, err := a.unmapFree(b, n, a.handles[:0], false)
			released += uint64(len(hs)) * a.gran
			a.releaseHandles(hs)
			a.handles = hs[:0]
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		size := b.size
		if err := a.freeSegment(b); err != nil {
			errs = append(errs, err)
			continue
		}
		released += size
	}
	clear(cands)
	a.scratch = cands[:0]
	if a.vmm && max == math.MaxUint64 {
		if err := a.releaseEmptySegments(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// releaseEmptySegments returns the address space of expandable segments
// with nothing mapped.
func (a *Allocator) releaseEmptySegments() error {
	var errs []error
	for i := 0; i < len(a.segList); {
		seg := a.segList[i]
		if !seg.expandable || seg.mapped != 0 {
			i++
			continue
		}
		if err := a.dev.FreeAddress(seg.base, seg.size); err != nil {
			errs = append(errs, fmt.Errorf("freeing %d bytes of address space at %#x: %w", seg.size, uintptr(seg.base), err))
			i++
			continue
		}
		a.pools[seg.pool].unmapped.Delete(seg.head)
		a.dropBlock(seg.head)
		a.virt -= seg.size
		a.removeSegment(seg)
	}
	return errors.Join(errs...)
}

// growFallback allocates a new segment with Device.Alloc, sized as
// PyTorch's allocator does, and returns its single free block, detached.
func (a *Allocator) growFallback(pk poolKind, s device.Stream, r uint64) (*block, error) {
	size := allocationSize(r)
	if a.phys+size > a.limit {
		return nil, &shortError{short: a.phys + size - a.limit}
	}
	p, err := a.dev.Alloc(size)
	if err != nil {
		err = fmt.Errorf("Alloc(%d): %w", size, err)
		if errors.Is(err, device.ErrOutOfMemory) {
			return nil, &shortError{short: size, cause: err}
		}
		return nil, err
	}
	a.phys += size
	a.cnt.deviceAllocs++
	seg := &segment{base: p, size: size, pool: pk, stream: s, st: a.streamState(s), mapped: size}
	b := a.newBlock()
	b.addr, b.size, b.stream, b.seg, b.state = p, size, s, seg, stateFree
	seg.head = b
	a.blocks[p] = b
	a.addSegment(seg)
	a.st.add(stReservedBytes, pk, int64(size))
	if a.trace != nil {
		a.trace.add(actSegmentAlloc, p, size, s)
	}
	return b, nil
}

// allocationSize is the size of a new Alloc segment for a block of r bytes.
func allocationSize(r uint64) uint64 {
	switch {
	case r <= SmallSize:
		return smallBuffer
	case r < minLargeAlloc:
		return largeBuffer
	default:
		return alignUp(r, roundLarge)
	}
}

// freeSegment returns the Alloc segment whose whole free block is b.
func (a *Allocator) freeSegment(b *block) error {
	seg := b.seg
	if err := a.dev.Free(seg.base); err != nil {
		return fmt.Errorf("freeing the %d-byte segment at %#x: %w", seg.size, uintptr(seg.base), err)
	}
	a.removeFree(b)
	delete(a.blocks, b.addr)
	a.phys -= seg.size
	a.cnt.deviceFrees++
	a.st.add(stReservedBytes, seg.pool, -int64(seg.size))
	if a.trace != nil {
		a.trace.add(actSegmentFree, seg.base, seg.size, seg.stream)
	}
	a.removeSegment(seg)
	a.dropBlock(b)
	return nil
}

// destroySegment returns all of seg's memory, whatever is in it (Close).
func (a *Allocator) destroySegment(seg *segment) error {
	if !seg.expandable {
		if err := a.dev.Free(seg.base); err != nil {
			return fmt.Errorf("freeing the segment at %#x: %w", uintptr(seg.base), err)
		}
		a.phys -= seg.size
		a.cnt.deviceFrees++
		return nil
	}
	var errs []error
	g := device.Ptr(a.gran)
	for i := 0; i < len(seg.handles); {
		if seg.handles[i] == 0 {
			i++
			continue
		}
		j := i
		for j < len(seg.handles) && seg.handles[j] != 0 {
			j++
		}
		// One Unmap per mapped run, then each handle is released.
		p := seg.base + device.Ptr(i)*g
		if err := a.dev.Unmap(p, uint64(j-i)*a.gran); err != nil {
			errs = append(errs, fmt.Errorf("unmapping %d bytes at %#x: %w", uint64(j-i)*a.gran, uintptr(p), err))
			i = j
			continue
		}
		for ; i < j; i++ {
			if err := a.dev.ReleasePhysical(seg.handles[i]); err != nil {
				errs = append(errs, fmt.Errorf("releasing the memory at %#x: %w", uintptr(seg.base+device.Ptr(i)*g), err))
				continue
			}
			a.phys -= uint64(g)
			a.cnt.deviceFrees++
		}
	}
	if len(errs) == 0 {
		if err := a.dev.FreeAddress(seg.base, seg.size); err != nil {
			errs = append(errs, fmt.Errorf("freeing the address space at %#x: %w", uintptr(seg.base), err))
		}
	}
	return errors.Join(errs...)
}
