package recompute

import "github.com/memscale/memscale/internal/satmath"

// Classes is a union-find forest over nodes that carry a cost; the cost of a
// class is kept at its root. It implements the equivalence classes of evicted
// neighbours used by h_DTR^eq: a storage gets a fresh node when it is evicted,
// the node is merged with the classes of its evicted neighbours, and when the
// storage comes back its own cost is subtracted from its class (the node
// stays in the class as an empty member). Costs are summed exactly in 128
// bits, so that a member leaving takes out exactly what it brought whatever
// the sums on the way, and read clamped to the int64 range.
type Classes struct {
	parent []int32
	size   []int32
	cost   []satmath.Int128
}

// ClassID names a node of Classes.
type ClassID int32

// NoClass is the zero value for "no node".
const NoClass ClassID = -1

// New adds a singleton class with the given cost and returns its node.
func (c *Classes) New(cost int64) ClassID {
	id := ClassID(len(c.parent))
	c.parent = append(c.parent, int32(id))
	c.size = append(c.size, 1)
	c.cost = append(c.cost, satmath.Int128Of(cost))
	return id
}

// Len returns the number of nodes ever created.
func (c *Classes) Len() int { return len(c.parent) }

// Find returns the root of x's class (iterative, with path halving).
func (c *Classes) Find(x ClassID) ClassID {
	p := c.parent
	for int32(x) != p[x] {
		p[x] = p[p[x]]
		x = ClassID(p[x])
	}
	return x
}

// Union merges the classes of a and b (summing their costs) and returns the
// new root. Merging a class with itself changes nothing.
func (c *Classes) Union(a, b ClassID) ClassID {
	ra, rb := c.Find(a), c.Find(b)
	if ra == rb {
		return ra
	}
	if c.size[ra] < c.size[rb] {
		ra, rb = rb, ra
	}
	c.parent[rb] = int32(ra)
	c.size[ra] += c.size[rb]
	c.cost[ra] = c.cost[ra].Add(c.cost[rb])
	return ra
}

// Cost returns the cost of x's class, clamped to the int64 range.
func (c *Classes) Cost(x ClassID) int64 { return c.cost[c.Find(x)].Clamp() }

// Add adds delta to the cost of x's class.
func (c *Classes) Add(x ClassID, delta int64) {
	r := c.Find(x)
	c.cost[r] = c.cost[r].AddInt64(delta)
}
