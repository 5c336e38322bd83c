package allocator

import (
	"fmt"

	"github.com/memscale/memscale/device"
)

// checkInvariants walks every segment and cross-checks the allocator's
// structures: blocks tile their segments, free blocks are coalesced and
// indexed, unmapped blocks are granule aligned and have no memory, the
// counters match what the walk finds.
func (a *Allocator) checkInvariants() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var (
		mapped      [numPools]int64
		inactive    [numPools]int64
		inactiveB   [numPools]int64
		allocs      [numPools]int64
		allocB      [numPools]int64
		active      [numPools]int64
		activeB     [numPools]int64
		reqB        [numPools]int64
		nFree       [numPools]int
		nUnmapped   [numPools]int
		nMapBlocks  int
		quick       int
		segs        [numPools]int64
		pendingSeen int
		nPlanFree   int
	)
	for i, seg := range a.segList {
		if i > 0 && a.segList[i-1].end() > seg.base {
			return fmt.Errorf("segments %#x and %#x overlap or are unsorted", a.segList[i-1].base, seg.base)
		}
		segs[seg.pool]++
		if seg.head == nil || seg.head.addr != seg.base || seg.head.prev != nil {
			return fmt.Errorf("segment %#x: bad head", seg.base)
		}
		at := seg.base
		var segMapped uint64
		var runEnd device.Ptr // end of the last granule counted
		for b := seg.head; b != nil; b = b.next {
			if b.addr != at {
				return fmt.Errorf("segment %#x: block at %#x, expected %#x", seg.base, b.addr, at)
			}
			if b.size == 0 || b.size%MinBlockSize != 0 || b.addr%MinBlockSize != 0 {
				return fmt.Errorf("block %#x: size %d / alignment not a multiple of %d", b.addr, b.size, MinBlockSize)
			}
			if b.seg != seg || b.stream != seg.stream {
				return fmt.Errorf("block %#x: wrong segment or stream", b.addr)
			}
			if b.next != nil && b.next.prev != b {
				return fmt.Errorf("block %#x: broken links", b.addr)
			}
			at = b.end()
			pk := seg.pool
			if b.state == stateUnmapped {
				nUnmapped[pk]++
				if !seg.expandable {
					return fmt.Errorf("block %#x: unmapped block in a non-expandable segment", b.addr)
				}
				if uint64(b.addr-seg.base)%a.gran != 0 || b.size%a.gran != 0 {
					return fmt.Errorf("unmapped block %#x (+%d) not granule aligned", b.addr, b.size)
				}
				if b.next != nil && b.next.state == stateUnmapped {
					return fmt.Errorf("unmapped blocks %#x and %#x not merged", b.addr, b.next.addr)
				}
				if !a.pools[pk].unmapped.Has(b) {
					return fmt.Errorf("unmapped block %#x missing from its index", b.addr)
				}
				if _, ok := a.blocks[b.addr]; ok {
					return fmt.Errorf("unmapped block %#x in the pointer map", b.addr)
				}
				// Spot-check the ends (a full scan of a large range is too slow
				// for a per-step check; the device's own accounting catches
				// the rest).
				g := device.Ptr(a.gran)
				for _, p := range []device.Ptr{b.addr, b.end() - g} {
					if seg.handles[(p-seg.base)/g] != 0 {
						return fmt.Errorf("unmapped block %#x has memory at %#x", b.addr, p)
					}
				}
				continue
			}
			nMapBlocks++
			if a.blocks[b.addr] != b {
				return fmt.Errorf("block %#x missing from the pointer map", b.addr)
			}
			if seg.expandable {
				g := device.Ptr(a.gran)
				first := seg.base + (b.addr-seg.base)/g*g
				if first < runEnd {
					first = runEnd // granule shared with the previous block
				}
				for p := first; p < b.end(); p += g {
					if seg.handles[(p-seg.base)/g] == 0 {
						return fmt.Errorf("block %#x (%s) has no memory at %#x", b.addr, b.stateName(), p)
					}
					segMapped += a.gran
					runEnd = p + g
				}
			}
			switch b.state {
			case stateFree:
				if b.isSplit() {
					inactive[pk]++
					inactiveB[pk] += int64(b.size)
				}
				if b.quick {
					quick++
					continue
				}
				if seg.plan {
					nPlanFree++
				} else {
					nFree[pk]++
				}
				if !a.freeTree(b).Has(b) {
					return fmt.Errorf("free block %#x missing from its tree", b.addr)
				}
				if n := b.next; n != nil && n.state == stateFree && !n.quick {
					return fmt.Errorf("free blocks %#x and %#x not coalesced", b.addr, n.addr)
				}
			case stateAllocated, statePending:
				if b.state == stateAllocated {
					allocs[pk]++
					allocB[pk] += int64(b.size)
				} else {
					pendingSeen++
				}
				active[pk]++
				activeB[pk] += int64(b.size)
				reqB[pk] += int64(b.req)
				if roundSize(b.req) > b.size {
					return fmt.Errorf("block %#x: %d bytes for a request of %d", b.addr, b.size, b.req)
				}
			}
		}
		if at != seg.end() {
			return fmt.Errorf("segment %#x: blocks end at %#x, segment at %#x", seg.base, at, seg.end())
		}
		if seg.expandable {
			if segMapped != seg.mapped {
				return fmt.Errorf("segment %#x: %d bytes mapped, records %d", seg.base, segMapped, seg.mapped)
			}
		}
		mapped[seg.pool] += int64(seg.mapped)
	}
	if nMapBlocks != len(a.blocks) {
		return fmt.Errorf("pointer map has %d entries, segments %d mapped blocks", len(a.blocks), nMapBlocks)
	}
	if quick != a.quickN {
		return fmt.Errorf("quick cache counts %d, walk found %d", a.quickN, quick)
	}
	if pendingSeen != len(a.pending) {
		return fmt.Errorf("pending list has %d, walk found %d", len(a.pending), pendingSeen)
	}
	if a.plans != nil && a.plans.free.Len() != nPlanFree {
		return fmt.Errorf("step-plan tree has %d blocks, walk found %d", a.plans.free.Len(), nPlanFree)
	}
	var phys uint64
	for pk := poolKind(0); pk < numPools; pk++ {
		if a.pools[pk].free.Len() != nFree[pk] {
			return fmt.Errorf("%s pool tree has %d blocks, walk found %d", pk, a.pools[pk].free.Len(), nFree[pk])
		}
		if a.pools[pk].unmapped.Len() != nUnmapped[pk] {
			return fmt.Errorf("%s pool unmapped index has %d blocks, walk found %d", pk, a.pools[pk].unmapped.Len(), nUnmapped[pk])
		}
		checks := []struct {
			k    statKind
			want int64
		}{
			{stReservedBytes, mapped[pk]}, {stInactiveSplit, inactive[pk]}, {stInactiveSplitBytes, inactiveB[pk]},
			{stAllocation, allocs[pk]}, {stAllocatedBytes, allocB[pk]}, {stActive, active[pk]},
			{stActiveBytes, activeB[pk]}, {stRequestedBytes, reqB[pk]}, {stSegment, segs[pk]},
		}
		for _, c := range checks {
			if got := a.st[c.k][1+pk].cur; got != c.want {
				return fmt.Errorf("%s.%s: counter %d, walk %d", statNames[c.k], statPoolNames[1+pk], got, c.want)
			}
		}
		phys += uint64(mapped[pk])
	}
	for k := statKind(0); k < numStatKinds; k++ {
		if a.st[k][0].cur != a.st[k][1].cur+a.st[k][2].cur {
			return fmt.Errorf("%s: all %d != small %d + large %d", statNames[k], a.st[k][0].cur, a.st[k][1].cur, a.st[k][2].cur)
		}
	}
	if phys != a.phys {
		return fmt.Errorf("physical bytes: %d held, %d mapped", a.phys, phys)
	}
	if a.reservedBytes.Load() != uint64(a.st.cur(stReservedBytes)) {
		return fmt.Errorf("Reserved() %d != reserved_bytes %d", a.reservedBytes.Load(), a.st.cur(stReservedBytes))
	}
	if a.allocatedBytes.Load() != uint64(a.st.cur(stAllocatedBytes)) {
		return fmt.Errorf("Allocated() %d != allocated_bytes %d", a.allocatedBytes.Load(), a.st.cur(stAllocatedBytes))
	}
	return nil
}

// blockSize returns the size of the block at p (test helper).
func (a *Allocator) blockSize(p device.Ptr) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if b := a.blocks[p]; b != nil {
		return b.size
	}
	return 0
}
