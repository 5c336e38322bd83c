package allocator

import (
	"errors"
	"fmt"

	"github.com/google/btree"

	"go.uber.org/zap"

	"github.com/memscale/memscale/device"
)

// cacheFreed puts a block that was just freed (detached, any state) into the
// cache: the quick cache when it has room, else the tree.
func (a *Allocator) cacheFreed(b *block) {
	b.state = stateFree
	b.freedAt = a.epoch
	b.seg.st.lastFree = a.epoch
	if a.quickN < quickCap && !b.seg.plan {
		a.quickPush(b)
		return
	}
	a.insertFree(b)
}

// quickPush parks the free block b on the quick stack of its stream and the
// rounded size of the request it served, without coalescing it.
func (a *Allocator) quickPush(b *block) {
	r := roundSize(b.req)
	l := b.qlist
	if l == nil || l.dead || l.size != r {
		l = a.quickListFor(b.stream, r)
	}
	b.quick = true
	b.qlist = l
	b.knext = l.head
	l.head = b
	b.qprev = nil
	b.qnext = a.quickHead
	if a.quickHead != nil {
		a.quickHead.qprev = b
	}
	a.quickHead = b
	a.quickN++
	a.countInactive(b, 1)
}

// quickLookup returns the quick stack of stream s and rounded size r, or nil.
func (a *Allocator) quickLookup(s device.Stream, r uint64) *quickList {
	qs := a.lastQS
	if qs == nil || qs.s != s {
		if qs = a.quickStreams[s]; qs == nil {
			return nil
		}
		a.lastQS = qs
	}
	return qs.lists[r]
}

// quickListFor returns the quick stack of stream s and rounded size r,
// creating it.
func (a *Allocator) quickListFor(s device.Stream, r uint64) *quickList {
	qs := a.quickStreams[s]
	if qs == nil {
		qs = &quickStream{s: s, lists: make(map[uint64]*quickList)}
		a.quickStreams[s] = qs
	}
	l := qs.lists[r]
	if l == nil {
		l = &quickList{stream: s, size: r}
		qs.lists[r] = l
		a.quickLists++
	}
	return l
}

// quickPop takes the top block of a non-empty quick stack.
func (a *Allocator) quickPop(l *quickList) *block {
	b := l.head
	l.head = b.knext
	a.quickUnlink(b)
	a.countInactive(b, -1)
	return b
}

// quickUnlink removes b from the list of all quick blocks and clears its
// quick-cache links (not its stack: callers pop it or reset the stack).
func (a *Allocator) quickUnlink(b *block) {
	if b.qprev != nil {
		b.qprev.qnext = b.qnext
	} else {
		a.quickHead = b.qnext
	}
	if b.qnext != nil {
		b.qnext.qprev = b.qprev
	}
	b.qprev, b.qnext, b.knext = nil, nil, nil
	b.quick = false
	a.quickN--
}

// flushQuick moves every quick block into the tree, coalescing it with its
// free neighbours.
func (a *Allocator) flushQuick() {
	for a.quickHead != nil {
		b := a.quickHead
		b.qlist.head = nil
		a.quickUnlink(b)
		a.countInactive(b, -1)
		a.insertFree(b)
	}
	if a.quickLists > 1024 {
		// Too many sizes seen: drop the index; blocks still pointing at the
		// old stacks see them marked dead.
		for _, qs := range a.quickStreams {
			for _, l := range qs.lists {
				l.dead = true
			}
		}
		clear(a.quickStreams)
		a.lastQS = nil
		a.quickLists = 0
	}
}

// countInactive adds (d = 1) or removes (d = -1) the free block b from the
// inactive_split counters.
func (a *Allocator) countInactive(b *block, d int64) {
	if b.isSplit() {
		pk := b.seg.pool
		a.st.add(stInactiveSplit, pk, d)
		a.st.add(stInactiveSplitBytes, pk, d*int64(b.size))
	}
}

// coalesce merges the detached free block b with its free (non-quick)
// neighbours, which leave the tree, and returns the merged detached block.
func (a *Allocator) coalesce(b *block) *block {
	if p := b.prev; p != nil && p.state == stateFree && !p.quick {
		a.removeFree(p)
		a.absorbNext(p)
		b = p
	}
	if n := b.next; n != nil && n.state == stateFree && !n.quick {
		a.removeFree(n)
		a.absorbNext(b)
	}
	return b
}

// absorbNext merges b's right neighbour into b, which keeps the later of
// their free times.
func (a *Allocator) absorbNext(b *block) {
	n := b.next
	b.size += n.size
	b.next = n.next
	if n.next != nil {
		n.next.prev = b
	}
	if n.freedAt > b.freedAt {
		b.freedAt = n.freedAt
	}
	delete(a.blocks, n.addr)
	a.dropBlock(n)
}

// insertFree coalesces the detached free block b and puts the result in the
// tree.
func (a *Allocator) insertFree(b *block) {
	b.state = stateFree
	a.addFree(a.coalesce(b))
}

// addFree puts the detached free block b, already coalesced, in the tree.
func (a *Allocator) addFree(b *block) {
	a.freeTree(b).ReplaceOrInsert(b)
	a.countInactive(b, 1)
}

// freeTree is the tree the free block b belongs in: its pool's, or the step
// plans' for a block of a plan segment.
func (a *Allocator) freeTree(b *block) *btree.BTreeG[*block] {
	if b.seg.plan {
		return a.plans.free
	}
	return a.pools[b.seg.pool].free
}

// removeFree takes the free block b out of the tree.
func (a *Allocator) removeFree(b *block) {
	if _, ok := a.freeTree(b).Delete(b); !ok {
		panic(fmt.Sprintf("allocator: internal error: free block %#x (%d bytes) missing from its tree", uintptr(b.addr), b.size))
	}
	a.countInactive(b, -1)
}

// bestFit takes the smallest cached block of pool pk on stream s with at
// least r bytes out of the tree, or returns nil.
func (a *Allocator) bestFit(pk poolKind, s device.Stream, r uint64) *block {
	a.pivot = block{stream: s, size: r}
	var found *block
	a.pools[pk].free.AscendGreaterOrEqual(&a.pivot, func(b *block) bool {
		if b.stream == s {
			found = b
		}
		return false
	})
	if found != nil {
		a.removeFree(found)
	}
	return found
}

// shouldSplit applies PyTorch's rule to the free block b: split a
// small-pool block when at least 512 bytes remain, a large-pool block when
// more than SmallSize remain. One refinement for expandable segments: a
// large-pool remainder that borders unmapped address space is split off
// however small, because it is not stranded there: the next growth of the
// segment extends it.
func shouldSplit(b *block, remaining uint64) bool {
	if remaining < MinBlockSize {
		return false
	}
	if b.seg.pool == smallPool || remaining > SmallSize {
		return true
	}
	return b.next != nil && b.next.state == stateUnmapped
}

// allocFrom splits the detached free block b (at least r bytes) as the rules
// say and hands out its front for a request of size bytes.
//
// While steps are recorded for step plans, a large block is split however
// little remains: the allocated bytes (the DTR engine's usage) are then the
// same wherever a request is placed, so the next step repeats this one's
// requests and its plan holds (plan.go).
func (a *Allocator) allocFrom(b *block, size, r uint64) device.Ptr {
	rem := b.size - r
	if shouldSplit(b, rem) || (rem >= MinBlockSize && a.plans != nil && a.plans.exact) {
		t := a.newBlock()
		t.addr = b.addr + device.Ptr(r)
		t.size = rem
		t.stream = b.stream
		t.seg = b.seg
		t.prev = b
		t.next = b.next
		t.state = stateFree
		t.freedAt = b.freedAt
		if b.next != nil {
			b.next.prev = t
		}
		b.next = t
		b.size = r
		a.blocks[t.addr] = t
		// b was coalesced, so nothing after t is free: no merging needed.
		a.addFree(t)
	}
	a.markAllocated(b, size)
	return b.addr
}

// freeWithEvents frees b, which RecordStream gave other streams: an event is
// recorded on each and b waits in the pending list until all completed.
func (a *Allocator) freeWithEvents(b *block) error {
	evs := make([]device.Event, 0, len(b.streams))
	for _, s := range b.streams {
		e, err := a.getEvent()
		if err == nil {
			err = a.dev.RecordEvent(e, s)
			if err != nil {
				a.putEvent(e)
			}
		}
		if err != nil {
			for _, x := range evs {
				a.putEvent(x)
			}
			// The stream was destroyed (or never valid): wait for the whole
			// device instead, so the block is freed rather than leaked.
			if serr := a.dev.Synchronize(); serr != nil {
				return fmt.Errorf("allocator: Free(%#x): recording an event on stream %#x failed and waiting for the device failed too (the allocation stays live): %w",
					uintptr(b.addr), uintptr(s), errors.Join(err, serr))
			}
			a.log.Warn("allocator: a record_stream stream cannot take events (destroyed?); waited for the device instead",
				zap.Uintptr("ptr", uintptr(b.addr)), zap.Uintptr("stream", uintptr(s)), zap.Error(err))
			evs = nil
			break
		}
		evs = append(evs, e)
	}
	pk := b.seg.pool
	a.st.add(stAllocation, pk, -1)
	a.st.add(stAllocatedBytes, pk, -int64(b.size))
	a.allocatedBytes.Store(uint64(a.st.cur(stAllocatedBytes)))
	b.state = statePending
	b.events = evs
	a.pending = append(a.pending, b)
	if a.trace != nil {
		a.trace.add(actFreeRequested, b.addr, b.size, b.stream)
	}
	return nil
}

// processPending returns to the cache every pending block whose events have
// all completed.
func (a *Allocator) processPending() {
	keep := a.pending[:0]
	for _, b := range a.pending {
		done := true
		for len(b.events) > 0 {
			e := b.events[len(b.events)-1]
			ok, err := a.dev.QueryEvent(e)
			if err != nil {
				a.log.Warn("allocator: querying a record_stream event", zap.Uintptr("ptr", uintptr(b.addr)), zap.Error(err))
			}
			if err != nil || !ok {
				done = false
				break
			}
			a.putEvent(e)
			b.events = b.events[:len(b.events)-1]
		}
		if !done {
			keep = append(keep, b)
			continue
		}
		a.completeFree(b)
	}
	clear(a.pending[len(keep):])
	a.pending = keep
}

// completeFree ends the pending free of b.
func (a *Allocator) completeFree(b *block) {
	pk := b.seg.pool
	a.st.add(stActive, pk, -1)
	a.st.add(stActiveBytes, pk, -int64(b.size))
	a.st.add(stRequestedBytes, pk, -int64(b.req))
	b.streams = nil
	b.events = nil
	if a.trace != nil {
		a.trace.add(actFreeCompleted, b.addr, b.size, b.stream)
	}
	a.cacheFreed(b)
}

// pollMarks advances each stream's done epoch past its completed marks.
func (a *Allocator) pollMarks() {
	for _, st := range a.streamList {
		for len(st.marks) > 0 {
			ok, err := a.dev.QueryEvent(st.marks[0].ev)
			if err != nil {
				a.log.Warn("allocator: querying a stream mark", zap.Uintptr("stream", uintptr(st.s)), zap.Error(err))
				break
			}
			if !ok {
				break
			}
			st.done = max(st.done, st.marks[0].covers)
			a.putEvent(st.marks[0].ev)
			st.marks[0] = mark{}
			st.marks = st.marks[1:]
		}
		if len(st.marks) == 0 {
			st.marks = nil
		}
	}
}

// refreshMarks makes the frees cached on every stream count as done or
// covered by a mark, without touching a stream handle that may no longer be
// valid. Only cur, the stream of the call being served (the caller hands it
// to us, so it is alive), gets a new mark, recorded without waiting. Frees on
// any other stream that no mark covers are covered by one device
// synchronization: memscale never records an event on a stream after the
// call that used it returned, because the program may have destroyed that
// stream since (a destroyed CUstream is a dangling pointer: the driver may
// crash rather than return an error), which is also why PyTorch's allocator
// never touches an allocation's stream after the fact. Pass cur = nil when
// no stream is being served. It then polls every mark.
func (a *Allocator) refreshMarks(cur *streamState) {
	a.pollMarks()
	foreign, recorded := false, false
	for _, st := range a.streamList {
		if st.lastFree <= st.done {
			continue // no free on st that is not known to be done
		}
		if n := len(st.marks); n > 0 && st.marks[n-1].covers >= a.epoch {
			continue // its latest frees are covered by a mark in flight
		}
		if st != cur {
			foreign = true
			continue
		}
		if len(st.marks) >= maxMarks || !a.recordMark(st) {
			foreign = true // covered by the synchronization below
			continue
		}
		recorded = true
	}
	if foreign {
		if err := a.synchronizeDevice(); err != nil {
			a.log.Warn("allocator: waiting for the device to reuse memory freed on other streams", zap.Error(err))
		}
		return
	}
	if recorded {
		a.epoch++
		a.pollMarks()
	}
}

// recordMark records a mark covering the frees of st up to the current
// epoch, without waiting; it reports whether that worked.
func (a *Allocator) recordMark(st *streamState) bool {
	e, err := a.getEvent()
	if err == nil {
		if err = a.dev.RecordEvent(e, st.s); err != nil {
			a.putEvent(e)
		}
	}
	if err != nil {
		a.log.Warn("allocator: recording a stream mark", zap.Uintptr("stream", uintptr(st.s)), zap.Error(err))
		return false
	}
	st.marks = append(st.marks, mark{covers: a.epoch, ev: e})
	a.cnt.marks++
	return true
}

// synchronizeDevice waits for all work queued on the device (every stream),
// returns the pending blocks (freed with record_stream events, all complete
// now) to the cache and counts every free cached so far as done, without
// touching any stream handle. The epoch advances past those frees.
func (a *Allocator) synchronizeDevice() error {
	if err := a.dev.Synchronize(); err != nil {
		return fmt.Errorf("allocator: waiting for the device: %w", err)
	}
	a.cnt.syncAllStreams++
	if len(a.pending) > 0 {
		a.processPending()
	}
	covers := a.epoch
	for _, st := range a.streamList {
		st.done = max(st.done, covers)
	}
	a.epoch++
	a.pollMarks() // every mark completed: their events go back to the pool
	return nil
}

// syncAll waits for all work queued on the device, so that all cached
// memory may be released, and returns the pending blocks (freed with
// record_stream events) that completed to the cache. It synchronizes the
// device rather than each stream (see refreshMarks: a stream may have been
// destroyed since it was used), as cudaFree does under PyTorch's allocator.
func (a *Allocator) syncAll() error {
	err := a.synchronizeDevice()
	if err != nil {
		a.log.Warn("allocator: could not wait for the device", zap.Error(err))
		if len(a.pending) > 0 {
			a.processPending() // those that completed all the same
		}
	}
	return err
}

// ready reports whether the cached block b is idle on the device: its
// stream finished the work queued before it was freed.
func (a *Allocator) ready(b *block) bool {
	return b.freedAt == 0 || b.freedAt <= b.seg.st.done
}

// mallocSlow serves a request the quick cache could not: best fit, then
// growth, then the out-of-memory path. Called and returns with a.mu held.
func (a *Allocator) mallocSlow(size, r uint64, s device.Stream) (device.Ptr, error) {
	pk := poolOf(r)
	if b := a.bestFit(pk, s, r); b != nil {
		return a.allocFrom(b, size, r), nil
	}
	if a.quickN > 0 {
		a.flushQuick()
		if b := a.bestFit(pk, s, r); b != nil {
			return a.allocFrom(b, size, r), nil
		}
	}
	b, err := a.grow(pk, s, r)
	if err == nil {
		return a.allocFrom(b, size, r), nil
	}
	var short *shortError
	if !errors.As(err, &short) {
		return 0, fmt.Errorf("allocator: Malloc(%d) on stream %#x: %w", size, uintptr(s), err)
	}

	// Out of memory: wait for every stream so all cached memory can be
	// released or moved, and try again; then ask the reclaimer.
	a.cnt.allocRetries++
	var calls int
	var reclaimed uint64
	for round := 0; ; round++ {
		if err := a.syncAll(); err != nil {
			a.log.Debug("allocator: out-of-memory path could not wait for every stream", zap.Error(err))
		}
		a.flushQuick()
		if b := a.bestFit(pk, s, r); b != nil {
			return a.allocFrom(b, size, r), nil
		}
		if a.vmm {
			// Address space of empty segments goes back, in case reserving
			// a new one is what failed.
			if rerr := a.releaseEmptySegments(); rerr != nil {
				a.log.Warn("allocator: releasing empty segments", zap.Error(rerr))
			}
		} else {
			// Whole free segments go back so that a new one can be allocated.
			if rerr := a.releaseCached(a.phys); rerr != nil {
				a.log.Warn("allocator: releasing cached segments", zap.Error(rerr))
			}
		}
		b, err = a.grow(pk, s, r)
		if err == nil {
			a.publish()
			return a.allocFrom(b, size, r), nil
		}
		if !errors.As(err, &short) {
			a.publish()
			return 0, fmt.Errorf("allocator: Malloc(%d) on stream %#x: %w", size, uintptr(s), err)
		}
		if a.reclaim == nil || round >= maxReclaimRounds {
			break
		}
		got := a.callReclaimer(a.reclaim, short.short)
		calls++
		reclaimed += got
		if a.closed {
			return 0, fmt.Errorf("allocator: Malloc(%d): %w", size, ErrClosed)
		}
		if got == 0 {
			break
		}
		if len(a.pending) > 0 {
			a.processPending()
		}
	}
	a.cnt.ooms++
	a.publish()
	devFree, _, derr := a.dev.MemInfo()
	if derr != nil {
		devFree = 0
	}
	if a.trace != nil {
		a.trace.addOOM(r, s, devFree)
	}
	oom := &OOMError{
		Requested:  size,
		Rounded:    r,
		Stream:     s,
		Allocated:  uint64(a.st.cur(stAllocatedBytes)),
		Reserved:   a.phys,
		Limit:      a.limit,
		DeviceFree: devFree,
		Retries:    a.cnt.allocRetries,
		OOMs:       a.cnt.ooms,
		Cause:      short.cause,

		ReclaimerInstalled: a.reclaim != nil,
		ReclaimCalls:       calls,
		Reclaimed:          reclaimed,
	}
	a.log.Debug("allocator: out of memory", zap.Error(oom))
	return 0, oom
}

// callReclaimer calls fn without the lock, which is held again when it
// returns or panics.
func (a *Allocator) callReclaimer(fn Reclaimer, need uint64) uint64 {
	a.mu.Unlock()
	defer a.mu.Lock()
	return fn(need)
}

// shortError is grow's report of missing memory.
type shortError struct {
	short uint64 // bytes missing
	cause error  // the device's error, or nil when the limit stopped growth
}

func (e *shortError) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("%d bytes short: %v", e.short, e.cause)
	}
	return fmt.Sprintf("%d bytes short of the limit", e.short)
}

func (e *shortError) Unwrap() error { return device.ErrOutOfMemory }

// grow makes a detached free block of at least r bytes for pool pk and
// stream s from new memory.
func (a *Allocator) grow(pk poolKind, s device.Stream, r uint64) (*block, error) {
	if a.vmm {
		return a.growVMM(pk, s, r)
	}
	return a.growFallback(pk, s, r)
}
