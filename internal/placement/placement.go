// Package placement computes a static memory plan: every buffer of a fixed
// schedule gets a fixed offset in one arena, so that buffers alive at the
// same time never share bytes. The arena's size is what a program needs when
// nothing is allocated dynamically; compared with the peak of live bytes it
// is the fragmentation floor of the schedule.
//
// The algorithm is greedy by size with best fit over lifetimes (as in
// TensorFlow Lite's and MiniMalloc's baselines): buffers are placed largest
// first; each goes into the smallest gap, between the buffers already placed
// whose lifetimes overlap its own, that holds it, or above them all when no
// gap does. It is not optimal (the problem is NP-hard), but on training
// steps it is within a few percent of the peak.
package placement

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// Buffer is one allocation of the schedule: Size bytes alive from event
// Start (inclusive) to event End (exclusive).
type Buffer struct {
	// Size is the buffer's size in bytes.
	Size uint64
	// Start and End delimit its lifetime: [Start, End). Two buffers
	// conflict when their lifetimes intersect and both sizes are non-zero.
	Start, End int64
}

// overlaps reports whether a and b are alive at a common instant.
func overlaps(a, b Buffer) bool { return a.Start < b.End && b.Start < a.End }

// Plan is a placement of buffers.
type Plan struct {
	// Offsets holds each buffer's offset in the arena, parallel to the
	// buffers placed.
	Offsets []uint64
	// Arena is the arena's size: the highest offset + size, after
	// rounding each size up to the alignment.
	Arena uint64
	// Peak is the highest total of the (aligned) sizes alive at once: no
	// placement can use a smaller arena.
	Peak uint64
}

// Fragmentation is the arena's excess over the peak as a fraction of the
// peak (0 = a perfect placement).
func (p Plan) Fragmentation() float64 {
	if p.Peak == 0 {
		return 0
	}
	return float64(p.Arena)/float64(p.Peak) - 1
}

// ErrLifetime is returned (wrapped) for a buffer whose End is before its
// Start.
var ErrLifetime = errors.New("buffer ends before it starts")

// alignUp rounds n up to a multiple of align (align 0 or 1: n).
func alignUp(n, align uint64) uint64 {
	if align <= 1 {
		return n
	}
	return (n + align - 1) / align * align
}

// Peak returns the highest total size of the buffers alive at one instant,
// each size rounded up to align.
func Peak(bufs []Buffer, align uint64) uint64 {
	type event struct {
		at    int64
		delta int64 // +1 start, -1 end
		size  uint64
	}
	ev := make([]event, 0, 2*len(bufs))
	for _, b := range bufs {
		if b.Size == 0 || b.End <= b.Start {
			continue
		}
		s := alignUp(b.Size, align)
		ev = append(ev, event{b.Start, 1, s}, event{b.End, -1, s})
	}
	// Ends before starts at the same instant: [Start, End) is half open.
	slices.SortFunc(ev, func(a, b event) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta))
	})
	var live, peak uint64
	for _, e := range ev {
		if e.delta > 0 {
			live += e.size
			peak = max(peak, live)
		} else {
			live -= e.size
		}
	}
	return peak
}

// Place places bufs with every size rounded up to align (0 or 1: bytes)
// and every offset a multiple of it. Zero-size buffers and buffers with an
// empty lifetime get offset 0 and take no room.
func Place(bufs []Buffer, align uint64) (Plan, error) {
	for i, b := range bufs {
		if b.End < b.Start {
			return Plan{}, fmt.Errorf("buffer %d (%d bytes, [%d, %d)): %w", i, b.Size, b.Start, b.End, ErrLifetime)
		}
	}
	order := make([]int, 0, len(bufs))
	for i, b := range bufs {
		if b.Size > 0 && b.End > b.Start {
			order = append(order, i)
		}
	}
	// Largest first; among equals the longer-lived, then the earlier, so the
	// result does not depend on the sort's stability.
	slices.SortFunc(order, func(x, y int) int {
		a, b := bufs[x], bufs[y]
		return cmp.Or(cmp.Compare(b.Size, a.Size), cmp.Compare(b.End-b.Start, a.End-a.Start),
			cmp.Compare(a.Start, b.Start), cmp.Compare(x, y))
	})
	plan := Plan{Offsets: make([]uint64, len(bufs)), Peak: Peak(bufs, align)}
	type span struct{ lo, hi uint64 }
	placed := make([]int, 0, len(order))
	var conflicts []span
	for _, i := range order {
		b := bufs[i]
		size := alignUp(b.Size, align)
		conflicts = conflicts[:0]
		for _, j := range placed {
			if overlaps(b, bufs[j]) {
				lo := plan.Offsets[j]
				conflicts = append(conflicts, span{lo, lo + alignUp(bufs[j].Size, align)})
			}
		}
		slices.SortFunc(conflicts, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
		best, bestGap, found := uint64(0), uint64(0), false
		var top uint64 // the lowest free address above the spans seen so far
		for _, c := range conflicts {
			if c.lo > top {
				if gap := c.lo - top; gap >= size && (!found || gap < bestGap) {
					best, bestGap, found = top, gap, true
				}
			}
			top = max(top, c.hi)
		}
		if !found {
			best = top
		}
		plan.Offsets[i] = best
		plan.Arena = max(plan.Arena, best+size)
		placed = append(placed, i)
	}
	return plan, nil
}

// Check verifies that plan places bufs without two buffers alive at once
// sharing a byte, and within the arena; it returns the first conflict.
func Check(bufs []Buffer, plan Plan, align uint64) error {
	if len(plan.Offsets) != len(bufs) {
		return fmt.Errorf("%d offsets for %d buffers", len(plan.Offsets), len(bufs))
	}
	for i, a := range bufs {
		if a.Size == 0 || a.End <= a.Start {
			continue
		}
		ai := plan.Offsets[i]
		if ai+alignUp(a.Size, align) > plan.Arena {
			return fmt.Errorf("buffer %d at %d (+%d) ends past the arena (%d)", i, ai, a.Size, plan.Arena)
		}
		for j := i + 1; j < len(bufs); j++ {
			b := bufs[j]
			if b.Size == 0 || b.End <= b.Start || !overlaps(a, b) {
				continue
			}
			bj := plan.Offsets[j]
			if ai < bj+alignUp(b.Size, align) && bj < ai+alignUp(a.Size, align) {
				return fmt.Errorf("buffers %d [%d, +%d) and %d [%d, +%d) are alive together and overlap", i, ai, a.Size, j, bj, b.Size)
			}
		}
	}
	return nil
}
