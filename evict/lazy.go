package evict

import (
	"cmp"
	"slices"

	rc "github.com/memscale/memscale/recompute"
)

// lazySelector is the candidate index built at the first victim search.
//
// Most of a region's ops never lead to an eviction: without a budget, or
// under one the step stays below, nothing is picked, yet keeping the
// tournament tree current costs every op a leaf-to-root path or two (a new
// output becomes a candidate, its inputs' keys fall). Until the first pick
// the candidates are only a set, kept as scanSelector keeps them (O(1) per
// add or remove, with the order they became candidates); key changes are
// ignored, since no key is stored yet. The first pick builds the index from
// the set - every member inserted in the order it became a candidate, with
// its key as of now, so ties break as if it had been built all along - and
// from then on every call goes to the index. The victims are the index's,
// and so the exact scan's (the property test in index_test.go checks both).
type lazySelector struct {
	e     *Engine
	set   *scanSelector  // the candidates until the first pick; nil after
	index *indexSelector // nil until the first pick
}

func newLazySelector(e *Engine) *lazySelector {
	return &lazySelector{e: e, set: newScanSelector(e)}
}

// built returns the index, building it from the set the first time.
func (z *lazySelector) built() *indexSelector {
	if z.index != nil {
		return z.index
	}
	members := slices.Clone(z.set.members)
	seqs := z.set.seqs
	slices.SortFunc(members, func(a, b rc.StorageID) int { return cmp.Compare(seqs[a], seqs[b]) })
	x := newIndexSelector(z.e).(*indexSelector)
	if n := len(members); n > x.n {
		x.grow(n) // one rebuild, not one per doubling
	}
	for _, s := range members {
		x.add(s)
	}
	z.index, z.set = x, nil
	return x
}

func (z *lazySelector) add(s rc.StorageID) {
	if z.index != nil {
		z.index.add(s)
		return
	}
	z.set.add(s)
}

func (z *lazySelector) remove(s rc.StorageID) {
	if z.index != nil {
		z.index.remove(s)
		return
	}
	z.set.remove(s)
}

// lowered and fell matter once keys are stored: before the build a key is
// computed when its storage goes into the index.
func (z *lazySelector) lowered(s rc.StorageID) {
	if z.index != nil {
		z.index.lowered(s)
	}
}

func (z *lazySelector) fell() {
	if z.index != nil {
		z.index.fell()
	}
}

func (z *lazySelector) pick(now int64) (rc.StorageID, bool) {
	if z.index == nil && z.set.len() == 0 {
		return 0, false // nothing to build an index of yet
	}
	return z.built().pick(now)
}

func (z *lazySelector) len() int {
	if z.index != nil {
		return z.index.len()
	}
	return z.set.len()
}
