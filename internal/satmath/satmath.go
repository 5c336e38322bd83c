// Package satmath is saturating integer arithmetic: sums and products of
// costs, clocks and byte counts that stop at the type's bounds instead of
// wrapping around. A wrapped cost turns positive into negative (a score into
// NaN, an overhead into 0); a saturated one stays the largest value there is,
// which every comparison still orders correctly.
package satmath

import (
	"math"
	"math/bits"
)

// AddInt64 returns a+b, or math.MaxInt64 / math.MinInt64 where the exact sum
// is above / below the int64 range.
func AddInt64(a, b int64) int64 {
	s := a + b
	// overflow iff a and b have the same sign and s has the other one
	if (a >= 0) == (b >= 0) && (s >= 0) != (a >= 0) {
		if a >= 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	}
	return s
}

// AddUint64 returns a+b, or math.MaxUint64 where the exact sum is larger.
func AddUint64(a, b uint64) uint64 {
	s, c := bits.Add64(a, b, 0)
	if c != 0 {
		return math.MaxUint64
	}
	return s
}

// SubUint64 returns a-b, or 0 where b > a.
func SubUint64(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// MulUint64 returns a*b, or math.MaxUint64 where the exact product is larger.
func MulUint64(a, b uint64) uint64 {
	h, l := bits.Mul64(a, b)
	if h != 0 {
		return math.MaxUint64
	}
	return l
}

// CheckedAddUint64 returns a+b and true, or 0 and false where the exact sum
// does not fit in a uint64.
func CheckedAddUint64(a, b uint64) (uint64, bool) {
	s, c := bits.Add64(a, b, 0)
	return s, c == 0
}

// Int128 is a signed 128-bit accumulator for sums of int64 values that must
// stay exact under additions and subtractions (a class's cost that members
// join and leave): 2^64 additions of any int64 cannot overflow it. Read it
// with Clamp.
type Int128 struct {
	hi int64
	lo uint64
}

// Int128Of returns v as an Int128.
func Int128Of(v int64) Int128 {
	var hi int64
	if v < 0 {
		hi = -1
	}
	return Int128{hi: hi, lo: uint64(v)}
}

// Add returns x+y.
func (x Int128) Add(y Int128) Int128 {
	lo, c := bits.Add64(x.lo, y.lo, 0)
	return Int128{hi: x.hi + y.hi + int64(c), lo: lo}
}

// AddInt64 returns x+v.
func (x Int128) AddInt64(v int64) Int128 { return x.Add(Int128Of(v)) }

// Clamp returns x clamped to the int64 range.
func (x Int128) Clamp() int64 {
	switch {
	case x.hi == 0 && x.lo <= math.MaxInt64:
		return int64(x.lo)
	case x.hi == -1 && x.lo > math.MaxInt64:
		return int64(x.lo)
	case x.hi < 0:
		return math.MinInt64
	}
	return math.MaxInt64
}
