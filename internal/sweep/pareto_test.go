package sweep

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFrontier(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name string
		pts  []Point
		want []int
	}{
		{name: "empty", pts: nil, want: nil},
		{name: "one", pts: []Point{{1, 2}}, want: []int{0}},
		{name: "monotone trade-off", pts: []Point{{1, 3}, {2, 2}, {3, 1}}, want: []int{0, 1, 2}},
		{name: "unsorted input", pts: []Point{{3, 1}, {1, 3}, {2, 2}}, want: []int{1, 2, 0}},
		{name: "dominated on both", pts: []Point{{1, 1}, {2, 2}}, want: []int{0}},
		{name: "bigger budget same overhead is dominated", pts: []Point{{1, 1.5}, {2, 1.5}}, want: []int{0}},
		{name: "same budget keeps the lowest overhead", pts: []Point{{1, 1.6}, {1, 1.4}, {2, 1.2}}, want: []int{1, 2}},
		{name: "equal points all kept", pts: []Point{{1, 1.5}, {2, 1.2}, {1, 1.5}}, want: []int{0, 2, 1}},
		{name: "never better after the best", pts: []Point{{1, 1.1}, {2, 1.3}, {3, 1.2}, {4, 1.05}}, want: []int{0, 3}},
		{name: "NaN ignored", pts: []Point{{nan, 1}, {1, nan}, {2, 1.2}}, want: []int{2}},
		{name: "grid of heuristics", pts: []Point{
			{0.2, 1.40}, {0.4, 1.20}, {0.6, 1.10}, // h1
			{0.2, 1.35}, {0.4, 1.25}, {0.6, 1.05}, // h2
			{0.4, 1.20}, // h3 ties h1
		}, want: []int{3, 1, 6, 5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Frontier(tc.pts)
			assert.Equal(t, tc.want, got)
			checkFrontier(t, tc.pts, got)
		})
	}
}

// TestFrontierRandom checks the definition on random points with many ties.
func TestFrontierRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		pts := make([]Point, rng.IntN(30))
		for i := range pts {
			pts[i] = Point{Budget: float64(rng.IntN(8)), Overhead: float64(rng.IntN(8))}
		}
		checkFrontier(t, pts, Frontier(pts))
	}
}

// checkFrontier checks that got is exactly the set of non-dominated points,
// by increasing budget.
func checkFrontier(t *testing.T, pts []Point, got []int) {
	t.Helper()
	on := map[int]bool{}
	for k, i := range got {
		on[i] = true
		if k > 0 {
			assert.LessOrEqual(t, pts[got[k-1]].Budget, pts[i].Budget, "ordered by budget")
		}
	}
	for i, p := range pts {
		if math.IsNaN(p.Budget) || math.IsNaN(p.Overhead) {
			assert.False(t, on[i], "NaN point %d on the frontier", i)
			continue
		}
		dominated := false
		for j, q := range pts {
			if j == i || math.IsNaN(q.Budget) || math.IsNaN(q.Overhead) {
				continue
			}
			if q.Budget <= p.Budget && q.Overhead <= p.Overhead && (q.Budget < p.Budget || q.Overhead < p.Overhead) {
				dominated = true
			}
		}
		assert.Equal(t, !dominated, on[i], "point %d %v: dominated=%v, on frontier=%v", i, p, dominated, on[i])
	}
}
