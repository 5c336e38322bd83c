package autotune

import (
	"testing"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/replay"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLeastBudgetFindsABudgetThatWorks: the lower bound of an unbudgeted run
// does not run the program; the budget the search names does (a replay
// finishes at it), and the largest it saw fail is within its precision.
func TestLeastBudgetFindsABudgetThatWorks(t *testing.T) {
	for _, name := range []string{"gpt2-small", "bert-small"} {
		t.Run(name, func(t *testing.T) {
			tr, peak := sample(t, name)
			base, err := replay.Run(tr, replay.Options{})
			require.NoError(t, err)
			floor := base.MinBudget
			require.Positive(t, floor)
			require.Less(t, floor, peak)
			cfg := evict.Config{Heuristic: evict.Auto}
			rep, err := LeastBudget(tr, LeastOptions{Floor: floor, Ceiling: peak, Engine: cfg})
			require.NoError(t, err)
			t.Logf("%s: floor %d, least %d (%.4fx), fails %d, %d replays, %.1f ms", name, floor, rep.Budget,
				float64(rep.Budget)/float64(floor), rep.Fails, len(rep.Tries), float64(rep.WallNS)/1e6)
			require.GreaterOrEqual(t, rep.Budget, floor)
			require.LessOrEqual(t, rep.Budget, peak)
			assert.Equal(t, floor, rep.Floor)
			cfg.Heuristic = evict.Default
			at, err := replay.Run(tr, replay.Options{Budget: rep.Budget, Engine: cfg, Plans: true, OverheadLimit: LeastOverheadLimit})
			require.NoError(t, err)
			assert.True(t, at.Feasible(), "the budget named runs the program: %s", at.Reason)
			if rep.Fails > 0 {
				below, err := replay.Run(tr, replay.Options{Budget: rep.Fails, Engine: cfg, Plans: true, OverheadLimit: LeastOverheadLimit})
				require.NoError(t, err)
				assert.False(t, below.Feasible())
				assert.LessOrEqual(t, rep.Budget-rep.Fails, leastPrecision(floor))
			}
			assert.LessOrEqual(t, len(rep.Tries), leastMaxReplays)
			assert.Equal(t, rep.Budget+leastPrecision(floor), rep.Threshold, "named with the search's precision as headroom")
		})
	}
}

// TestLeastBudgetTrustsItsCeiling: a floor at or above the ceiling (a step
// whose floor is its peak) names the ceiling without a replay.
func TestLeastBudgetTrustsItsCeiling(t *testing.T) {
	tr, peak := sample(t, "gpt2-small")
	rep, err := LeastBudget(tr, LeastOptions{Floor: peak, Ceiling: peak})
	require.NoError(t, err)
	assert.Equal(t, LeastReport{Budget: peak, Threshold: peak + leastPrecision(peak), Headroom: leastPrecision(peak),
		Floor: peak, WallNS: rep.WallNS}, rep)
	rep, err = LeastBudget(tr, LeastOptions{Floor: 1, Ceiling: 2})
	require.NoError(t, err)
	assert.Equal(t, uint64(2), rep.Budget, "1 byte runs nothing: the ceiling is the least known")
	assert.False(t, rep.Replayed)
	_, err = LeastBudget(nil, LeastOptions{})
	assert.Error(t, err)
}
