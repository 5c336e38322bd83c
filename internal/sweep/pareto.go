package sweep

import (
	"math"
	"sort"
)

// Point is a (budget, overhead) outcome; smaller is better on both axes.
type Point struct {
	Budget   float64
	Overhead float64
}

// Frontier returns the indices of the Pareto-optimal points: those that no
// other point dominates (another point dominates p when it is no worse on
// both budget and overhead and better on at least one). Equal points are
// all kept. Points with a NaN coordinate are ignored. The indices are
// ordered by increasing budget (then increasing index).
func Frontier(pts []Point) []int {
	order := make([]int, 0, len(pts))
	for i, p := range pts {
		if !math.IsNaN(p.Budget) && !math.IsNaN(p.Overhead) {
			order = append(order, i)
		}
	}
	sort.SliceStable(order, func(a, b int) bool {
		pa, pb := pts[order[a]], pts[order[b]]
		if pa.Budget != pb.Budget {
			return pa.Budget < pb.Budget
		}
		return pa.Overhead < pb.Overhead
	})
	var out []int
	best := math.Inf(1) // lowest overhead among points of smaller budget
	for k := 0; k < len(order); {
		// the points sharing this budget; order[k] has their lowest overhead
		b := pts[order[k]].Budget
		low := pts[order[k]].Overhead
		end := k
		for end < len(order) && pts[order[end]].Budget == b {
			end++
		}
		if low < best {
			for _, i := range order[k:end] {
				if pts[i].Overhead == low {
					out = append(out, i)
				}
			}
			best = low
		}
		k = end
	}
	return out
}
