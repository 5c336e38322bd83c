package allocator

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"go.uber.org/zap"

	"github.com/memscale/memscale/device"
)

// growPlan says where an expandable segment grows: granules [m0, m1) of the
// unmapped block u get memory.
type growPlan struct {
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
	k := int(uint64(plan.m1-plan.m0) / a.gran)
	hs, err := a.obtainGranules(k, r, plan.u)
	if err != nil {
		return nil, err
	}
	return a.mapInto(plan, hs)
}

// planGrow picks, among the unmapped blocks of pool pk and stream s, the one
// where a block of r bytes needs the fewest new granules, counting the cached
// free blocks on either side that it would extend. Ties go to the lowest
// address.
func (a *Allocator) planGrow(pk poolKind, s device.Stream, r uint64) (growPlan, bool) {
	g := device.Ptr(a.gran)
	var best growPlan
	bestK := uint64(math.MaxUint64)
	a.pivot = block{stream: s}
	a.pools[pk].unmapped.AscendGreaterOrEqual(&a.pivot, func(u *block) bool {
		if u.stream != s {
			return false
		}
		start, end := u.addr, u.end()
		if p := u.prev; p != nil && p.state == stateFree && !p.quick {
			start = p.addr
		}
		if n := u.next; n != nil && n.state == stateFree && !n.quick {
			end = n.end()
		}
		if uint64(end-start) < r {
			return true
		}
		// Front: the block starts where the free run before u starts.
		var m1 device.Ptr
		switch bEnd := start + device.Ptr(r); {
		case bEnd >= u.end():
			m1 = u.end()
		case bEnd <= u.addr:
			m1 = u.addr + g
		default:
			m1 = u.addr + (bEnd-u.addr+g-1)/g*g
		}
		kf := uint64(m1-u.addr) / uint64(g)
		// Back: the block ends where the free run after u ends.
		var m0 device.Ptr
		switch bStart := end - device.Ptr(r); {
		case bStart <= u.addr:
			m0 = u.addr
		case bStart >= u.end():
			m0 = u.end() - g
		default:
			m0 = u.addr + (bStart-u.addr)/g*g
		}
		kb := uint64(u.end()-m0) / uint64(g)
		if kf <= kb {
			if kf < bestK {
				best, bestK = growPlan{u: u, m0: u.addr, m1: m1}, kf
			}
		} else if kb < bestK {
			best, bestK = growPlan{u: u, m0: m0, m1: u.end()}, kb
		}
		return true
	})
	return best, bestK != math.MaxUint64
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
// then new ones up to the limit.
func (a *Allocator) obtainGranules(k int, r uint64, u *block) ([]device.Handle, error) {
	g := a.gran
	hs := a.handles[:0]
	room := func() int {
		if a.limit <= a.phys {
			return 0
		}
		return int((a.limit - a.phys) / g)
	}
	soft := room()
	if a.slack >= 0 {
		hwm := uint64(a.st.cur(stAllocatedBytes)) + r
		if a.hwm > hwm {
			hwm = a.hwm
		}
		extra := uint64(a.slack * float64(hwm))
		if m := uint64(minCacheGranules) * g; extra < m {
			extra = m
		}
		bound := hwm + extra
		if bound > a.phys {
			soft = min(soft, int((bound-a.phys)/g))
		} else {
			soft = 0
		}
	}
	var cause error
	var err error
	hs, cause, err = a.createGranules(hs, min(k, soft))
	if err == nil && len(hs) < k {
		hs, err = a.steal(hs, k, u)
	}
	if err == nil && len(hs) < k && cause == nil {
		hs, cause, err = a.createGranules(hs, min(k-len(hs), room()))
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
// and appends them to hs until it holds k. The free neighbours of u, which
// the growth will extend, are left alone. Largest free blocks go first.
func (a *Allocator) steal(hs []device.Handle, k int, u *block) ([]device.Handle, error) {
	a.refreshMarks(a.streams[u.stream])
	need := k - len(hs)
	cands := a.scratch[:0]
	found := 0
	for _, pk := range [...]poolKind{largePool, smallPool} {
		for _, st := range a.streamList {
			if found >= need {
				break
			}
			a.pivot = block{stream: st.s, size: math.MaxUint64, addr: ^device.Ptr(0)}
			a.pools[pk].free.DescendLessOrEqual(&a.pivot, func(b *block) bool {
				if b.stream != st.s || b.size < a.gran {
					return false
				}
				if b == u.prev || b == u.next || !a.ready(b) {
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
	return hs, err
}

// unmapFree unmaps the top take whole granules of the cached free block b
// and appends their handles to hs. The unmapped range becomes an unmapped
// block; what is left of b stays cached.
func (a *Allocator) unmapFree(b *block, take int, hs []device.Handle, remap bool) ([]device.Handle, error) {
	seg, g := b.seg, device.Ptr(a.gran)
	_, hi := a.wholeGranules(b)
	lo := hi - device.Ptr(take)*g
	a.removeFree(b)
	cut := hi
	var err error
	// One Unmap for the whole run of granules (cuMemUnmap accepts several
	// adjacent whole mappings; PyTorch unmaps handle by handle).
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

// mapInto maps hs at the planned granules (one MapRange: access is set
// once for the range) and returns the detached free block, coalesced with
// its free neighbours, that now covers them. On failure the handles are
// released and nothing changes.
func (a *Allocator) mapInto(plan growPlan, hs []device.Handle) (*block, error) {
	u, seg, g := plan.u, plan.u.seg, device.Ptr(a.gran)
	n := uint64(len(hs)) * a.gran
	if err := a.dev.MapRange(plan.m0, a.gran, hs); err != nil {
		a.releaseHandles(hs)
		a.handles = hs[:0]
		return nil, fmt.Errorf("mapping %d bytes at %#x: %w", n, uintptr(plan.m0), err)
	}
	a.pools[seg.pool].unmapped.Delete(u)
	first := (plan.m0 - seg.base) / g
	for i, h := range hs {
		seg.handles[first+device.Ptr(i)] = h
	}
	seg.mapped += n
	a.st.add(stReservedBytes, seg.pool, int64(n))
	a.cnt.maps += int64(len(hs))
	clear(hs)
	a.handles = hs[:0]
	mapped := plan.m0 + device.Ptr(n)
	if a.trace != nil {
		a.trace.add(actSegmentMap, plan.m0, n, u.stream)
	}
	m := a.carveMapped(u, plan.m0, mapped)
	return a.coalesce(m), nil
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
	cands := a.scratch[:0]
	for pk := range a.pools {
		a.pools[pk].free.Ascend(func(b *block) bool {
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
		})
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
