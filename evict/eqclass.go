package evict

import (
	"github.com/memscale/memscale/internal/satmath"
	rc "github.com/memscale/memscale/recompute"
)

// eqTracker implements the union-find approximation of the evicted
// neighbourhood (h_DTR^eq): an evicted storage gets a fresh class node worth
// its own cost, merged with the classes of its evicted direct neighbours; a
// storage that comes back (or is released while evicted) takes its cost out
// of its class. A storage's cost is its own plus the distinct classes of its
// evicted neighbours: parents and children (ancOnly = false) or parents only
// (ancOnly = true: the classes that hold what must be re-run first).
type eqTracker struct {
	g       *rc.Graph
	cl      rc.Classes
	node    []rc.ClassID // per storage; NoClass unless evicted
	ancOnly bool
	lowered func(rc.StorageID)

	seen  []uint64 // per class node: stamp of the last cost() that counted it
	epoch uint64
	// boundary[root] lists storages adjacent to members of the class (a
	// superset, cleaned when walked): the storages whose cost falls when the
	// class loses cost.
	boundary [][]rc.StorageID
}

func newEqTracker(g *rc.Graph, ancOnly bool) *eqTracker {
	return &eqTracker{g: g, ancOnly: ancOnly, lowered: func(rc.StorageID) {}}
}

// setLowered installs lowered; the classes name the storages whose costs
// fall, so fell is never needed.
func (t *eqTracker) setLowered(fn func(rc.StorageID), _ func()) { t.lowered = fn }

func (t *eqTracker) nodeOf(s rc.StorageID) rc.ClassID {
	if int(s) < len(t.node) {
		return t.node[s]
	}
	return rc.NoClass
}

func (t *eqTracker) cost(s rc.StorageID) int64 {
	st := t.g.Storage(s)
	c := st.Compute
	t.epoch++
	c = satmath.AddInt64(c, t.sum(st.Parents))
	if !t.ancOnly {
		c = satmath.AddInt64(c, t.sum(st.Children))
	}
	return c
}

// bound is the exact cost: it costs one pass over the direct neighbours.
func (t *eqTracker) bound(s rc.StorageID) int64 { return t.cost(s) }

func (t *eqTracker) sum(ns []rc.StorageID) int64 {
	var c int64
	for _, n := range ns {
		x := t.nodeOf(n)
		if x == rc.NoClass {
			continue
		}
		r := t.cl.Find(x)
		if t.seen[r] == t.epoch {
			continue
		}
		t.seen[r] = t.epoch
		c = satmath.AddInt64(c, t.cl.Cost(r))
	}
	return c
}

func (t *eqTracker) added(rc.OpID) {}

func (t *eqTracker) dropped(s rc.StorageID) {
	for int(s) >= len(t.node) {
		t.node = append(t.node, rc.NoClass)
	}
	st := t.g.Storage(s)
	x := t.cl.New(st.Compute)
	t.seen = append(t.seen, 0)
	t.boundary = append(t.boundary, nil)
	t.node[s] = x
	root := x
	merge := func(ns []rc.StorageID) {
		for _, n := range ns {
			y := t.nodeOf(n)
			if y == rc.NoClass {
				continue
			}
			ra, rb := t.cl.Find(root), t.cl.Find(y)
			if ra == rb {
				continue
			}
			nr := t.cl.Union(ra, rb)
			other := ra
			if nr == ra {
				other = rb
			}
			// keep the longer boundary list, append the shorter one
			if len(t.boundary[other]) > len(t.boundary[nr]) {
				t.boundary[nr], t.boundary[other] = t.boundary[other], t.boundary[nr]
			}
			t.boundary[nr] = append(t.boundary[nr], t.boundary[other]...)
			t.boundary[other] = nil
			root = nr
		}
	}
	merge(st.Parents)
	merge(st.Children)
	root = t.cl.Find(root)
	// s's material neighbours now border the class
	b := t.boundary[root]
	for _, n := range st.Parents {
		if isMaterial(t.g.Storage(n)) {
			b = append(b, n)
		}
	}
	for _, n := range st.Children {
		if isMaterial(t.g.Storage(n)) {
			b = append(b, n)
		}
	}
	t.boundary[root] = b
}

// leave takes the evicted storage s out of its class (its cost is
// subtracted; the node stays as an empty member) and notifies every storage
// whose cost may have fallen: the class's boundary and s's neighbours.
func (t *eqTracker) leave(s rc.StorageID) {
	x := t.nodeOf(s)
	if x == rc.NoClass {
		return
	}
	st := t.g.Storage(s)
	t.cl.Add(x, -st.Compute)
	t.node[s] = rc.NoClass
	root := t.cl.Find(x)
	// walk the boundary, dropping entries that are no longer material and
	// duplicates
	t.epoch++
	mark := t.g.Mark()
	b := t.boundary[root][:0]
	for _, n := range t.boundary[root] {
		if t.g.Marked(n, mark) || !isMaterial(t.g.Storage(n)) {
			continue
		}
		t.g.SetMark(n, mark)
		b = append(b, n)
		t.lowered(n)
	}
	t.boundary[root] = b
	for _, n := range st.Parents {
		t.lowered(n)
	}
	for _, n := range st.Children {
		t.lowered(n)
	}
}

func (t *eqTracker) resident(ss []rc.StorageID) {
	for _, s := range ss {
		t.leave(s)
		// s itself now borders the classes of its evicted neighbours
		st := t.g.Storage(s)
		for _, ns := range [2][]rc.StorageID{st.Parents, st.Children} {
			for _, n := range ns {
				if y := t.nodeOf(n); y != rc.NoClass {
					r := t.cl.Find(y)
					t.boundary[r] = append(t.boundary[r], s)
				}
			}
		}
		t.lowered(s)
	}
}

func (t *eqTracker) released(s rc.StorageID, prev rc.State) {
	if prev == rc.Evicted {
		t.leave(s)
	}
}

var _ tracker = (*eqTracker)(nil)
