package sweep

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/memscale/memscale/evict"
)

// DefaultRatios are the budget ratios swept when none are given.
var defaultRatios = [...]float64{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}

// DefaultRatios returns the budget ratios swept when none are given:
// 0.1, 0.2, ..., 0.9.
func DefaultRatios() []float64 { return append([]float64(nil), defaultRatios[:]...) }

// defaultStep is the step of a ratio range written without one.
const defaultStep = 0.1

// ParseRatios parses a comma-separated list of budget ratios. Each item is a
// number in (0, 1] or a range "lo..hi" (step 0.1) or "lo..hi/step", both
// ends included. The result is sorted and free of duplicates. Errors name
// the offending item.
func ParseRatios(s string) ([]float64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("empty ratio list")
	}
	var out []float64
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("empty item in ratio list %q", s)
		}
		lo, hi, ok := strings.Cut(item, "..")
		if !ok {
			r, err := parseRatio(item)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
			continue
		}
		step := defaultStep
		if h, st, ok := strings.Cut(hi, "/"); ok {
			hi = h
			v, err := strconv.ParseFloat(strings.TrimSpace(st), 64)
			if err != nil || !(v > 0) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("ratio range %q: step %q is not a positive number", item, st)
			}
			step = v
		}
		a, err := parseRatio(lo)
		if err != nil {
			return nil, fmt.Errorf("ratio range %q: %w", item, err)
		}
		b, err := parseRatio(hi)
		if err != nil {
			return nil, fmt.Errorf("ratio range %q: %w", item, err)
		}
		if b < a {
			return nil, fmt.Errorf("ratio range %q: end %g is below start %g", item, b, a)
		}
		n := int(math.Floor((b-a)/step + 1e-9))
		if n > 10000 {
			return nil, fmt.Errorf("ratio range %q: %d ratios, too many", item, n+1)
		}
		for i := 0; i <= n; i++ {
			out = append(out, roundRatio(a+float64(i)*step))
		}
	}
	sort.Float64s(out)
	uniq := out[:1]
	for _, r := range out[1:] {
		if r != uniq[len(uniq)-1] {
			uniq = append(uniq, r)
		}
	}
	return uniq, nil
}

// parseRatio parses one ratio in (0, 1].
func parseRatio(s string) (float64, error) {
	s = strings.TrimSpace(s)
	r, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("ratio %q is not a number", s)
	}
	if math.IsNaN(r) || r <= 0 || r > 1 {
		return 0, fmt.Errorf("ratio %q out of range: must be in (0, 1] (a fraction of the baseline peak)", s)
	}
	return r, nil
}

// roundRatio removes the float noise of a range step (0.30000000000000004).
func roundRatio(r float64) float64 { return math.Round(r*1e9) / 1e9 }

// AllHeuristics is the heuristic list item that stands for every heuristic.
const AllHeuristics = "all"

// ParseHeuristics parses a comma-separated list of heuristic names
// (evict.ParseHeuristic's names, "default", or AllHeuristics). Default is
// resolved to the heuristic it stands for; duplicates are dropped, the order
// of first appearance kept.
func ParseHeuristics(s string) ([]evict.Heuristic, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("empty heuristic list")
	}
	var out []evict.Heuristic
	seen := map[evict.Heuristic]bool{}
	add := func(h evict.Heuristic) {
		if h == evict.Default {
			h = h.Resolve()
		}
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("empty item in heuristic list %q", s)
		}
		if strings.EqualFold(item, AllHeuristics) {
			for _, h := range evict.Heuristics() {
				add(h)
			}
			add(evict.Auto)
			continue
		}
		h, err := evict.ParseHeuristic(item)
		if err != nil {
			return nil, fmt.Errorf("%w, or %s", err, AllHeuristics)
		}
		add(h)
	}
	return out, nil
}
