package evict

import (
	rc "github.com/memscale/memscale/recompute"
)

// region is the evicted neighbourhood of a material storage in one
// direction: the evicted storages reachable from it through evicted storages
// only (interior), the material storages where that walk stops (frontier),
// and the summed cost of the interior. When only the frontier is needed
// (the descendant side of an ancestors-only cost) interior is nil.
type region struct {
	interior map[rc.StorageID]struct{}
	frontier map[rc.StorageID]struct{}
	compute  int64
}

func newRegion(interior bool) *region {
	r := &region{frontier: map[rc.StorageID]struct{}{}}
	if interior {
		r.interior = map[rc.StorageID]struct{}{}
	}
	return r
}

// regionTracker keeps, for every material storage, its evicted neighbourhood
// in both directions, incrementally as in the DTR authors' simulator: when a
// storage is evicted, the regions on its frontier absorb it; when storages
// come back, their regions and the regions on their frontiers are rebuilt.
// It serves h_DTR (e*, both directions) and the ancestors-only costs (h_MSPS,
// anc-sqrt), for which the descendant side keeps only its frontier (needed to
// find the ancestor regions an eviction grows) and no interior.
type regionTracker struct {
	g        *rc.Graph
	fwd, rev []*region // indexed by storage; nil unless material
	useFwd   bool      // count the descendant region in cost
	lowered  func(rc.StorageID)
	stack    []rc.StorageID
	affected map[rc.StorageID]struct{}
}

func newRegionTracker(g *rc.Graph, useFwd bool) *regionTracker {
	return &regionTracker{g: g, useFwd: useFwd, lowered: func(rc.StorageID) {}, affected: map[rc.StorageID]struct{}{}}
}

func (t *regionTracker) setLowered(fn func(rc.StorageID)) { t.lowered = fn }

func (t *regionTracker) cost(s rc.StorageID) int64 {
	c := t.g.Storage(s).Compute
	if int(s) < len(t.rev) && t.rev[s] != nil {
		c += t.rev[s].compute
		if t.useFwd {
			c += t.fwd[s].compute
		}
	}
	return c
}

func (t *regionTracker) ensure(s rc.StorageID) {
	for int(s) >= len(t.fwd) {
		t.fwd = append(t.fwd, nil)
		t.rev = append(t.rev, nil)
	}
	if t.fwd[s] == nil {
		t.fwd[s], t.rev[s] = newRegion(t.useFwd), newRegion(true)
	}
}

// added links the new outputs into their neighbours' frontiers. All inputs
// and outputs are resident, so no interior changes.
func (t *regionTracker) added(o rc.OpID) {
	g := t.g
	op := g.Op(o)
	for _, out := range op.Outputs {
		t.ensure(g.Tensor(out).Storage)
	}
	for _, out := range op.Outputs {
		cs := g.Tensor(out).Storage
		for _, in := range op.Inputs {
			ps := g.Tensor(in).Storage
			if ps == cs {
				continue
			}
			t.ensure(ps)
			t.rev[cs].frontier[ps] = struct{}{}
			t.fwd[ps].frontier[cs] = struct{}{}
		}
	}
}

func (t *regionTracker) dropped(s rc.StorageID) {
	t.ensure(s)
	sf, sr := t.fwd[s], t.rev[s]
	for f := range sr.frontier {
		if r := t.fwd[f]; r != nil {
			t.absorb(f, r, s, sf)
		}
	}
	for f := range sf.frontier {
		if r := t.rev[f]; r != nil {
			t.absorb(f, r, s, sr)
		}
	}
	t.fwd[s], t.rev[s] = nil, nil
}

// absorb folds the just-evicted storage s, with its region sreg of the same
// direction, into the region r of the material storage base.
func (t *regionTracker) absorb(base rc.StorageID, r *region, s rc.StorageID, sreg *region) {
	delete(r.frontier, s)
	for x := range sreg.frontier {
		if x != base {
			r.frontier[x] = struct{}{}
		}
	}
	if r.interior == nil {
		return
	}
	for x := range sreg.interior {
		if _, ok := r.interior[x]; !ok {
			r.interior[x] = struct{}{}
			r.compute += t.g.Storage(x).Compute
		}
	}
	if _, ok := r.interior[s]; !ok {
		r.interior[s] = struct{}{}
		r.compute += t.g.Storage(s).Compute
	}
}

func (t *regionTracker) resident(ss []rc.StorageID) {
	clear(t.affected)
	for _, s := range ss {
		t.ensure(s)
		t.rebuild(s, t.fwd[s], true)
		t.rebuild(s, t.rev[s], false)
	}
	fwdAff := make([]rc.StorageID, 0, 8)
	revAff := make([]rc.StorageID, 0, 8)
	for _, s := range ss {
		for f := range t.rev[s].frontier {
			fwdAff = append(fwdAff, f)
		}
		for f := range t.fwd[s].frontier {
			revAff = append(revAff, f)
		}
	}
	for _, f := range fwdAff {
		if r := t.fwd[f]; r != nil {
			t.rebuild(f, r, true)
			t.affected[f] = struct{}{}
		}
	}
	for _, f := range revAff {
		if r := t.rev[f]; r != nil {
			t.rebuild(f, r, false)
			t.affected[f] = struct{}{}
		}
	}
	for _, s := range ss {
		t.lowered(s)
	}
	for f := range t.affected {
		t.lowered(f)
	}
}

// rebuild recomputes r, the region of base in direction fwd, by a walk on an
// explicit stack.
func (t *regionTracker) rebuild(base rc.StorageID, r *region, fwd bool) {
	clear(r.frontier)
	r.compute = 0
	g := t.g
	if r.interior == nil {
		t.rebuildFrontier(base, r, fwd)
		return
	}
	clear(r.interior)
	stack := append(t.stack[:0], base)
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		xs := g.Storage(x)
		next := xs.Parents
		if fwd {
			next = xs.Children
		}
		for _, u := range next {
			us := g.Storage(u)
			switch {
			case isMaterial(us):
				if u != base {
					r.frontier[u] = struct{}{}
				}
			case isEvicted(us):
				if _, ok := r.interior[u]; !ok {
					r.interior[u] = struct{}{}
					r.compute += us.Compute
					stack = append(stack, u)
				}
			}
		}
	}
	t.stack = stack
}

// rebuildFrontier is rebuild for a frontier-only region: visited evicted
// storages are remembered with graph marks instead of an interior set.
func (t *regionTracker) rebuildFrontier(base rc.StorageID, r *region, fwd bool) {
	t.walkFrontier(base, fwd, r.frontier)
}

// walkFrontier adds to out the material storages reached from start (whose
// own state does not matter) through evicted storages only, following
// children (fwd) or parents.
func (t *regionTracker) walkFrontier(start rc.StorageID, fwd bool, out map[rc.StorageID]struct{}) {
	g := t.g
	mark := g.Mark()
	g.SetMark(start, mark)
	stack := append(t.stack[:0], start)
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		xs := g.Storage(x)
		next := xs.Parents
		if fwd {
			next = xs.Children
		}
		for _, u := range next {
			if g.Marked(u, mark) {
				continue
			}
			g.SetMark(u, mark)
			us := g.Storage(u)
			switch {
			case isMaterial(us):
				out[u] = struct{}{}
			case isEvicted(us):
				stack = append(stack, u)
			}
		}
	}
	t.stack = stack
}

// released takes s out of every region. A material storage only sits on
// frontiers; an evicted one sits inside the regions of the material storages
// around its evicted component, which are rebuilt.
func (t *regionTracker) released(s rc.StorageID, prev rc.State) {
	if prev != rc.Evicted {
		if int(s) < len(t.fwd) && t.fwd[s] != nil {
			for f := range t.rev[s].frontier {
				if r := t.fwd[f]; r != nil {
					delete(r.frontier, s)
				}
			}
			for f := range t.fwd[s].frontier {
				if r := t.rev[f]; r != nil {
					delete(r.frontier, s)
				}
			}
			t.fwd[s], t.rev[s] = nil, nil
		}
		return
	}
	// The material storages whose regions contain s are found by walking
	// from s through evicted storages: backwards for the forward regions
	// that hold s, forwards for the backward ones.
	for _, fwd := range []bool{false, true} {
		clear(t.affected)
		t.walkFrontier(s, fwd, t.affected)
		for f := range t.affected {
			r := t.fwd[f]
			if fwd {
				r = t.rev[f]
			}
			if r != nil {
				t.rebuild(f, r, !fwd)
			}
			t.lowered(f)
		}
	}
}

var _ tracker = (*regionTracker)(nil)
