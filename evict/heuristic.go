package evict

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
)

// Heuristic selects the eviction score. Lower scores are evicted first.
type Heuristic uint8

// Heuristics (REFERENCE.md section 5). c = cost of the ops that rebuild the
// storage, m = bytes, s = staleness (clock - last access), T and M = the
// MegEngine exponents recomp_time_factor and recomp_memory_factor (default 1).
const (
	// Default is memscale's choice; see DefaultHeuristic.
	Default Heuristic = iota
	// DTR is h_DTR (e*): (c + cost of the evicted neighbourhood closure in
	// both directions)^T / (m^M * s).
	DTR
	// DTREq is h_DTR^eq: like DTR, but the neighbourhood cost is the sum over
	// the distinct union-find classes of evicted direct neighbours.
	DTREq
	// DTRLocal is h_DTR^local: c^T / (m^M * s).
	DTRLocal
	// MSPS is h_MSPS: (c + cost of the evicted-ancestor closure)^T / m^M.
	MSPS
	// LRU evicts the least recently used storage first.
	LRU
	// Size evicts the largest storage first: 1 / m^M.
	Size
	// DTREqAnc is h_DTR^eq restricted to ancestors: the cost of the distinct
	// union-find classes of evicted parents, i.e. roughly what has to be
	// re-run first to bring the storage back, over (m^M * s).
	DTREqAnc
	// AncSqrt is memscale's heuristic: (c + cost of the evicted-ancestor
	// closure)^T / (m^M * sqrt(s)). The numerator is what recomputing the
	// storage actually costs (h_MSPS's); the score is the geometric mean of
	// h_MSPS (no staleness) and h_DTR with that same cost (staleness to the
	// first power), because neither recency signal alone predicts reuse
	// well across models.
	AncSqrt
	// Auto is a policy, not a score: the engine scores with
	// DefaultHeuristic and records its program (Config.Record), so that at
	// the end of the step the caller can have package autotune choose the
	// configuration for the steps that follow (memscale_dtr_tune).
	Auto
	numHeuristics
)

// DefaultHeuristic is what Default resolves to.
const DefaultHeuristic = AncSqrt

var heuristicNames = [numHeuristics]string{
	Default:  "default",
	DTR:      "dtr",
	DTREq:    "dtr-eq",
	DTRLocal: "dtr-local",
	MSPS:     "msps",
	LRU:      "lru",
	Size:     "size",
	DTREqAnc: "dtr-eq-anc",
	AncSqrt:  "anc-sqrt",
	Auto:     "auto",
}

// String returns the heuristic's configuration name.
func (h Heuristic) String() string {
	if h < numHeuristics {
		return heuristicNames[h]
	}
	return fmt.Sprintf("Heuristic(%d)", uint8(h))
}

// Resolve maps Default and Auto to the heuristic they score with.
func (h Heuristic) Resolve() Heuristic {
	if h == Default || h == Auto {
		return DefaultHeuristic
	}
	return h
}

// stale reports whether the score divides by staleness.
func (h Heuristic) stale() bool {
	switch h.Resolve() {
	case MSPS, Size:
		return false
	}
	return true
}

// Heuristics returns every scoring heuristic: all but Default and Auto.
func Heuristics() []Heuristic {
	out := make([]Heuristic, 0, numHeuristics-2)
	for h := Heuristic(1); h < Auto; h++ {
		out = append(out, h)
	}
	return out
}

// ParseHeuristic parses a heuristic name ("dtr", "dtr-eq", "dtr-local",
// "msps", "lru", "size", "dtr-eq-anc", "anc-sqrt", "auto", "default";
// case-insensitive, "_" accepted for "-", "" means default).
func ParseHeuristic(s string) (Heuristic, error) {
	n := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "_", "-")
	if n == "" {
		return Default, nil
	}
	for h, name := range heuristicNames {
		if n == name {
			return Heuristic(h), nil
		}
	}
	return 0, fmt.Errorf("unknown heuristic %q (accepted: %s)", s, strings.Join(heuristicNames[:], ", "))
}

// key is what the index and the exact scan compare: a clock-independent
// numerator a and, for the staleness heuristics, the last access L; the score
// at clock T is a / (T - L) (a alone for the others). seq breaks ties: the
// storage that became a candidate last goes first, as in the DTR authors'
// simulator, whose candidate pool is a list scanned with "<=". What ranks
// above the score: a reserve key (a storage that an open plan still reads,
// planhold.go) goes after every ordinary one, and among reserve keys the
// smaller due (the storage read last) goes first; then, within each tier, a
// dead key (a storage nothing referenced needs) goes first.
type key struct {
	a       float64
	l       int64
	seq     uint64
	due     int64 // reserve keys only: Engine.due
	id      int32
	dead    bool
	reserve bool
}

// before reports whether x is evicted before y at clock now.
func before(x, y key, now int64, stale bool) bool {
	if x.reserve != y.reserve {
		return y.reserve
	}
	if x.reserve && x.due != y.due {
		return x.due < y.due
	}
	if x.dead != y.dead {
		return x.dead
	}
	var c int
	if stale {
		c = cmpScore(x.a, staleness(now, x.l), y.a, staleness(now, y.l))
	} else {
		c = cmpFloat(x.a, y.a)
	}
	if c != 0 {
		return c < 0
	}
	return x.seq > y.seq
}

// staleness returns now - l, 0 when l is not before now (a clock that
// saturated, or an access at the current clock).
func staleness(now, l int64) uint64 {
	if l >= now {
		return 0
	}
	return uint64(now) - uint64(l)
}

// rank places a numerator in the total order the comparators use: 0 for
// zero, 1 for a finite positive number, 2 for +Inf and 3 for anything else
// (NaN, negative numbers: never produced by numerator, ordered last so that
// a comparison is a total order whatever it is given).
func rank(a float64) int {
	switch {
	case a == 0:
		return 0
	case a > 0 && a < math.Inf(1):
		return 1
	case a > 0:
		return 2
	}
	return 3
}

// cmpFloat compares two numerators in the total order of rank, then by
// value: -1, 0 or 1. NaN equals NaN, so that the order is reflexive.
func cmpFloat(x, y float64) int {
	rx, ry := rank(x), rank(y)
	switch {
	case rx != ry:
		return cmpInt(rx, ry)
	case rx == 1 && x < y:
		return -1
	case rx == 1 && x > y:
		return 1
	}
	return 0
}

func cmpInt(x, y int) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// sameNumerator reports whether two numerators are the same value
// (bit for bit: NaN is the same as NaN, so a key always equals itself).
func sameNumerator(x, y float64) bool { return math.Float64bits(x) == math.Float64bits(y) }

// score returns the heuristic score as a float (for reports; decisions use
// before, which is exact).
func (k key) score(now int64, stale bool) float64 {
	if !stale {
		return k.a
	}
	d := now - k.l
	if d <= 0 {
		return math.Inf(1)
	}
	return k.a / float64(d)
}

// cmpScore compares a1/d1 with a2/d2 exactly (a/0 = +Inf and 0/0 = +Inf as
// in simrd, and above every a/d with d > 0, even a = +Inf), returning -1, 0
// or 1. It is a total preorder for every a, NaN and infinities included (see
// cmpMul).
func cmpScore(a1 float64, d1 uint64, a2 float64, d2 uint64) int {
	switch {
	case d1 == 0 && d2 == 0:
		return 0
	case d1 == 0:
		return 1
	case d2 == 0:
		return -1
	}
	// a1/d1 < a2/d2  <=>  a1*d2 < a2*d1
	return cmpMul(a1, d2, a2, d1)
}

// cmpMul compares a1*d1 with a2*d2 exactly for finite a >= 0. A product
// with a zero factor is 0; otherwise a numerator that is not finite and
// positive (+Inf, or NaN and negatives, which numerator never produces)
// makes the product rank by rank above every finite one, so the comparison
// stays a total preorder whatever the floats.
func cmpMul(a1 float64, d1 uint64, a2 float64, d2 uint64) int {
	z1 := a1 == 0 || d1 == 0
	z2 := a2 == 0 || d2 == 0
	switch {
	case z1 && z2:
		return 0
	case z1:
		return -1
	case z2:
		return 1
	}
	if r1, r2 := rank(a1), rank(a2); r1 != 1 || r2 != 1 {
		return cmpInt(r1, r2)
	}
	m1, e1 := decompose(a1)
	m2, e2 := decompose(a2)
	h1, l1 := bits.Mul64(m1, d1)
	h2, l2 := bits.Mul64(m2, d2)
	b1, b2 := bitLen128(h1, l1), bitLen128(h2, l2)
	if t1, t2 := b1+e1, b2+e2; t1 != t2 {
		if t1 < t2 {
			return -1
		}
		return 1
	}
	// Same magnitude: shift the shorter product up to the longer one's
	// length; the exponents then agree and the integers compare directly.
	if b1 < b2 {
		h1, l1 = shl128(h1, l1, uint(b2-b1))
	} else if b2 < b1 {
		h2, l2 = shl128(h2, l2, uint(b1-b2))
	}
	switch {
	case h1 < h2:
		return -1
	case h1 > h2:
		return 1
	case l1 < l2:
		return -1
	case l1 > l2:
		return 1
	}
	return 0
}

// decompose returns m, e with f = m * 2^e and m an integer below 2^53.
func decompose(f float64) (uint64, int) {
	b := math.Float64bits(f)
	exp := int(b>>52) & 0x7ff
	mant := b & (1<<52 - 1)
	if exp == 0 {
		return mant, -1074
	}
	return mant | 1<<52, exp - 1075
}

func bitLen128(h, l uint64) int {
	if h != 0 {
		return 64 + bits.Len64(h)
	}
	return bits.Len64(l)
}

func shl128(h, l uint64, k uint) (uint64, uint64) {
	switch {
	case k == 0:
		return h, l
	case k >= 64:
		return l << (k - 64), 0
	}
	return h<<k | l>>(64-k), l << k
}
