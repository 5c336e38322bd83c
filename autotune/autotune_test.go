package autotune

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/sharedtraces"
	rc "github.com/memscale/memscale/recompute"
	"github.com/memscale/memscale/replay"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func readTrace(t testing.TB, path string) *rc.Trace {
	t.Helper()
	tr, err := rc.LoadTrace(path)
	require.NoError(t, err)
	return tr
}

// sample returns one of the traces the project recorded itself
// (samples/traces), with its baseline peak.
func sample(t testing.TB, name string) (*rc.Trace, uint64) {
	tr := readTrace(t, filepath.Join("..", "samples", "traces", name+".log.gz"))
	base, err := replay.Run(tr, replay.Options{})
	require.NoError(t, err)
	return tr, base.Peak
}

func TestCandidates(t *testing.T) {
	cs := Candidates()
	require.Len(t, cs, 57)
	assert.Equal(t, "anc-sqrt", cs[0].String(), "memscale's default goes first: it wins ties")
	seen := map[string]bool{}
	for _, c := range cs {
		name := c.String()
		assert.False(t, seen[name], "duplicate candidate %s", name)
		seen[name] = true
		// the JSON a caller merges into the next engine's config is accepted
		// and gives back the same settings
		js, err := json.Marshal(c.ConfigJSON())
		require.NoError(t, err)
		cfg, _, err := evict.DecodeConfig(js, evict.Config{})
		require.NoError(t, err, "%s", js)
		back := Candidate{Heuristic: cfg.Heuristic, RecompTimeFactor: cfg.RecompTimeFactor,
			RecompMemoryFactor: cfg.RecompMemoryFactor, SimulatorCompat: cfg.SimulatorCompat}
		assert.Equal(t, name, back.String())
	}
	for _, h := range []string{"dtr[sim]", "dtr-eq[sim]", "msps[sim]", "lru[sim]", "size[sim]", "dtr[t=2,m=0.5]", "msps[t=0.5]"} {
		assert.True(t, seen[h], "missing %s", h)
	}
}

func TestEngineCandidates(t *testing.T) {
	cs := EngineCandidates()
	require.Len(t, cs, 52)
	assert.Equal(t, Candidates()[0], cs[0])
	for _, c := range cs {
		assert.False(t, c.SimulatorCompat, "%s", c)
	}
}

func TestCandidateString(t *testing.T) {
	for _, tc := range []struct {
		c    Candidate
		want string
	}{
		{Candidate{}, "anc-sqrt"},
		{Candidate{Heuristic: evict.DTR, RecompTimeFactor: 1, RecompMemoryFactor: 1}, "dtr"},
		{Candidate{Heuristic: evict.DTR, RecompTimeFactor: 2}, "dtr[t=2]"},
		{Candidate{Heuristic: evict.MSPS, RecompMemoryFactor: 0.5, SimulatorCompat: true}, "msps[m=0.5,sim]"},
	} {
		assert.Equal(t, tc.want, tc.c.String())
	}
}

// exhaustive replays every candidate to the end and returns the index of the
// lowest overhead (first among equals), or -1.
func exhaustive(t *testing.T, tr *rc.Trace, budget uint64, cands []Candidate, plans bool) (int, []replay.Result) {
	best := -1
	var all []replay.Result
	for i, c := range cands {
		res, err := replay.Run(tr, replay.Options{Budget: budget, Engine: c.Apply(evict.Config{}), Plans: plans})
		require.NoError(t, err)
		all = append(all, res)
		if res.Feasible() && (best < 0 || res.Overhead < all[best].Overhead) {
			best = i
		}
	}
	return best, all
}

// TestTuneMatchesExhaustiveSearch checks the pruned, parallel search
// against replaying every candidate to the end: same choice, same overhead,
// for any number of workers, in both rebuild modes.
func TestTuneMatchesExhaustiveSearch(t *testing.T) {
	cands := Candidates()
	for _, name := range []string{"gpt2-small", "bert-small"} {
		tr, peak := sample(t, name)
		ratios := []float64{0.3, 0.5, 0.8}
		if raceEnabled {
			ratios = ratios[1:2] // the race detector makes each replay ~10x slower
		}
		for _, ratio := range ratios {
			for _, plans := range []bool{false, true} {
				budget := replay.Budget(ratio, peak)
				want, all := exhaustive(t, tr, budget, cands, plans)
				require.GreaterOrEqual(t, want, 0, "%s %.1f: some candidate must finish", name, ratio)
				for _, workers := range []int{1, 3} {
					rep, err := Tune(tr, Options{Budget: budget, Workers: workers, Plans: plans})
					require.NoError(t, err)
					assert.True(t, rep.Feasible)
					assert.Equal(t, want, rep.BestIndex, "%s %.1f plans=%v workers=%d: chose %s, exhaustive %s",
						name, ratio, plans, workers, rep.Best, cands[want])
					assert.Equal(t, all[want].Overhead, rep.Overhead())
					assert.Equal(t, all[0].Overhead, rep.Trials[0].Result.Overhead, "the default runs to the end")
					assert.LessOrEqual(t, rep.Overhead(), all[0].Overhead, "never worse than the default")
					assert.Equal(t, tr.Len(), rep.Instructions)
					for i, tri := range rep.Trials {
						if tri.Result.Feasible() {
							assert.Equal(t, all[i].Overhead, tri.Result.Overhead, "a finished trial is the full replay")
						}
					}
				}
			}
		}
	}
}

func TestTuneTiesGoToTheFirstCandidate(t *testing.T) {
	tr, peak := sample(t, "gpt2-small")
	// a budget above the peak: nothing is evicted, every candidate ties
	rep, err := Tune(tr, Options{Budget: 2 * peak})
	require.NoError(t, err)
	assert.Equal(t, 0, rep.BestIndex)
	assert.Equal(t, "anc-sqrt", rep.Best.String())
	c := []Candidate{{Heuristic: evict.DTR}, {Heuristic: evict.MSPS}}
	rep, err = Tune(tr, Options{Budget: 2 * peak, Candidates: c})
	require.NoError(t, err)
	assert.Equal(t, "dtr", rep.Best.String())
}

func TestTuneInfeasible(t *testing.T) {
	tr, _ := sample(t, "gpt2-small")
	rep, err := Tune(tr, Options{Budget: 1})
	require.NoError(t, err)
	assert.False(t, rep.Feasible)
	assert.Equal(t, 0, rep.BestIndex, "nothing finished: keep the first")
	assert.Zero(t, rep.Overhead())
	for _, tri := range rep.Trials {
		assert.Equal(t, replay.OOM, tri.Result.Status, "%s", tri.Candidate)
	}
}

func TestTuneErrors(t *testing.T) {
	tr, peak := sample(t, "gpt2-small")
	_, err := Tune(tr, Options{})
	require.ErrorIs(t, err, ErrNoBudget)
	_, err = Tune(tr, Options{Budget: peak, Candidates: []Candidate{}})
	require.ErrorContains(t, err, "no candidates")
	_, err = Tune(tr, Options{Budget: peak, Candidates: []Candidate{{Heuristic: evict.Heuristic(200)}}})
	require.ErrorContains(t, err, "unknown heuristic")
}

// TestTunedNeverWorseThanTheReferences replays shared traces (the DTR
// authors' own) and checks the target for the auto policy: at every
// ratio, the tuned configuration's overhead is at most that of every
// reference heuristic as the authors' simulator runs it. Under the race
// detector only the two smallest traces run.
func TestTunedNeverWorseThanTheReferences(t *testing.T) {
	refs := []Candidate{
		{Heuristic: evict.DTR, SimulatorCompat: true}, {Heuristic: evict.DTREq, SimulatorCompat: true},
		{Heuristic: evict.MSPS, SimulatorCompat: true}, {Heuristic: evict.LRU, SimulatorCompat: true},
		{Heuristic: evict.Size, SimulatorCompat: true},
	}
	for _, tc := range sharedtraces.ForTest(t) {
		if raceEnabled && tc.Name != "resnet32" && tc.Name != "unet" {
			continue
		}
		tr := readTrace(t, tc.Path)
		base, err := replay.Run(tr, replay.Options{})
		require.NoError(t, err)
		for _, ratio := range []float64{0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9} {
			budget := replay.Budget(ratio, base.Peak)
			rep, err := Tune(tr, Options{Budget: budget})
			require.NoError(t, err)
			for _, ref := range refs {
				res, err := replay.Run(tr, replay.Options{Budget: budget, Engine: ref.Apply(evict.Config{})})
				require.NoError(t, err)
				if !res.Feasible() {
					continue
				}
				require.True(t, rep.Feasible, "%s %.1f: %s finishes, the tuner found nothing", tc.Name, ratio, ref)
				assert.LessOrEqual(t, rep.Overhead(), res.Overhead, "%s %.1f: tuned %s vs reference %s", tc.Name, ratio, rep.Best, ref)
			}
		}
	}
}
