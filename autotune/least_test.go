package autotune

import (
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/memscale/memscale/evict"
	rc "github.com/memscale/memscale/recompute"
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
			at, err := replay.Run(tr, replay.Options{Budget: rep.Budget, Engine: cfg, Plans: true, Region: true, OverheadLimit: LeastOverheadLimit})
			require.NoError(t, err)
			assert.True(t, at.Feasible(), "the budget named runs the program: %s", at.Reason)
			if rep.Fails > 0 {
				below, err := replay.Run(tr, replay.Options{Budget: rep.Fails, Engine: cfg, Plans: true, Region: true, OverheadLimit: LeastOverheadLimit})
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

// recording reads a step program an engine recorded (the C ABI's
// "least_budget" search's input, written by a live region of the corpus,
// bench/scripts): the engine's floor, the peak of the unbudgeted step, its
// configuration, and the program.
func recording(t *testing.T, name string) (*rc.Trace, uint64, uint64, evict.Config) {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name+".json.gz"))
	require.NoError(t, err)
	defer f.Close()
	z, err := gzip.NewReader(f)
	require.NoError(t, err)
	var d struct {
		Floor   uint64          `json:"floor"`
		Peak    uint64          `json:"peak"`
		Config  json.RawMessage `json:"config"`
		Names   []string        `json:"names"`
		Outputs []int32         `json:"outputs"`
		Instrs  []rc.Instr      `json:"instrs"`
	}
	require.NoError(t, json.NewDecoder(z).Decode(&d))
	tr := &rc.Trace{Names: d.Names, Outputs: d.Outputs}
	for _, in := range d.Instrs {
		require.NoError(t, tr.Append(in))
	}
	cfg, _, err := evict.DecodeConfig(d.Config, evict.Config{})
	require.NoError(t, err)
	return tr, d.Floor, d.Peak, cfg
}

// TestLeastBudgetReplaysAsTheRegionRuns: the search replays a step as the
// region runs it (replay.Options.Region: inputs in order, parking, restarts),
// so the threshold it names for the corpus's steps is close to their floor,
// where the live region trains (resnet_dummy trained at 1.02x its floor;
// transformer_lm at 1.05x). The replay of the C ABI's plans alone named
// 1.262x and 1.104x: it keeps every resident input of an op locked while
// another is rebuilt, and never parks.
func TestLeastBudgetReplaysAsTheRegionRuns(t *testing.T) {
	for _, tc := range []struct {
		name string
		most float64 // the threshold named over the floor, at most
	}{
		{"resnet_dummy-step1", 1.01},
		{"transformer_lm-step1", 1.06},
		{"dcgan-step4", 1.01},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, floor, peak, cfg := recording(t, tc.name)
			rep, err := LeastBudget(tr, LeastOptions{Floor: floor, Ceiling: peak, Engine: cfg})
			require.NoError(t, err)
			ratio := float64(rep.Threshold) / float64(floor)
			t.Logf("%s: floor %d, threshold %d (%.4fx), %d replays", tc.name, floor, rep.Threshold, ratio, len(rep.Tries))
			require.True(t, rep.Replayed)
			assert.LessOrEqual(t, ratio, tc.most)
			cfg.Record = false
			at, err := replay.Run(tr, replay.Options{Budget: rep.Budget, Engine: cfg, Plans: true, Region: true,
				OverheadLimit: LeastOverheadLimit, Check: true})
			require.NoError(t, err)
			assert.True(t, at.Feasible(), at.Reason)
			assert.LessOrEqual(t, at.Peak, rep.Budget)
		})
	}
}
