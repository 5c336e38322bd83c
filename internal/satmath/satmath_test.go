package satmath

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestAddInt64(t *testing.T) {
	for _, c := range []struct{ a, b, want int64 }{
		{1, 2, 3},
		{math.MaxInt64, 1, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64, math.MaxInt64},
		{math.MaxInt64 - 1, 1, math.MaxInt64},
		{math.MinInt64, -1, math.MinInt64},
		{math.MinInt64, math.MinInt64, math.MinInt64},
		{math.MaxInt64, math.MinInt64, -1},
		{-5, 3, -2},
		{0, 0, 0},
	} {
		assert.Equal(t, c.want, AddInt64(c.a, c.b), "%d + %d", c.a, c.b)
		assert.Equal(t, c.want, AddInt64(c.b, c.a), "%d + %d", c.b, c.a)
	}
}

func TestUint64(t *testing.T) {
	for _, c := range []struct{ a, b, sum, diff, prod uint64 }{
		{3, 2, 5, 1, 6},
		{2, 3, 5, 0, 6},
		{math.MaxUint64, 1, math.MaxUint64, math.MaxUint64 - 1, math.MaxUint64},
		{math.MaxUint64, math.MaxUint64, math.MaxUint64, 0, math.MaxUint64},
		{1 << 62, 1 << 62, 1 << 63, 0, math.MaxUint64},
		{1 << 32, 1 << 31, 1<<32 + 1<<31, 1 << 31, 1 << 63},
		{0, math.MaxUint64, math.MaxUint64, 0, 0},
	} {
		assert.Equal(t, c.sum, AddUint64(c.a, c.b), "%d + %d", c.a, c.b)
		assert.Equal(t, c.diff, SubUint64(c.a, c.b), "%d - %d", c.a, c.b)
		assert.Equal(t, c.prod, MulUint64(c.a, c.b), "%d * %d", c.a, c.b)
		s, ok := CheckedAddUint64(c.a, c.b)
		assert.Equal(t, c.sum != math.MaxUint64 || c.a == 0 || c.b == 0, ok, "%d + %d", c.a, c.b)
		if ok {
			assert.Equal(t, c.sum, s)
		}
	}
}

func TestInt128(t *testing.T) {
	var x Int128
	for range 4 {
		x = x.AddInt64(math.MaxInt64)
	}
	assert.Equal(t, int64(math.MaxInt64), x.Clamp(), "4 * MaxInt64 clamps")
	for range 4 {
		x = x.AddInt64(-math.MaxInt64)
	}
	assert.Equal(t, int64(0), x.Clamp(), "exact after the subtractions")
	x = x.AddInt64(math.MinInt64).AddInt64(math.MinInt64)
	assert.Equal(t, int64(math.MinInt64), x.Clamp())
	x = x.AddInt64(math.MaxInt64).AddInt64(math.MaxInt64).AddInt64(2)
	assert.Equal(t, int64(0), x.Clamp())
	assert.Equal(t, int64(-7), Int128Of(-7).Clamp())
	assert.Equal(t, int64(math.MinInt64), Int128Of(math.MinInt64).Clamp())
	assert.Equal(t, int64(math.MaxInt64), Int128Of(math.MaxInt64).Clamp())
}
