package evict

import (
	"strconv"
	"testing"

	"github.com/memscale/memscale/internal/soak"
	"github.com/stretchr/testify/require"
)

// TestSoakEngine is the engine's part of the soak (issue 32): the property
// test's random histories (twin: an engine on the candidate index against
// one on the exact scan, the reference, compared at every victim choice,
// with plans, abandoned plans, views, releases and references, every
// heuristic, random exponents and minimum sizes) extended with budget
// changes, run over seeds until the operations of soak.Ops are done: a
// short slice under go test, MEMSCALE_SOAK_OPS for make soak. Each operation
// is one step of the history or one budget change.
func TestSoakEngine(t *testing.T) {
	total, err := soak.Ops(20000, 0.4)
	require.NoError(t, err)
	steps := 400
	if soak.Long() {
		steps = 5000
	}
	var done, picks, changes int64
	histories := 0
	for seed := int64(100000); done < total; seed++ {
		w := newTwin(t, seed)
		for i := 0; i < steps && done < total; i++ {
			done++
			if w.rng.Intn(50) == 0 {
				b := max(w.idx.Budget()/2+uint64(w.rng.Intn(int(w.idx.Budget()+1))), 500)
				w.bothArg("set budget", int64(b), func(e *Engine) error { e.SetBudget(b); return nil })
				changes++
				if !w.evict(0) {
					break
				}
				continue
			}
			if !w.step() {
				break
			}
			if i%16 == 0 {
				checkSoftHolds(t, w.idx, "seed "+strconv.FormatInt(seed, 10)+" step "+strconv.Itoa(i))
			}
		}
		require.Equal(t, w.idx.Stats().Evictions, w.scan.Stats().Evictions, "seed %d", seed)
		require.Equal(t, w.idx.Clock(), w.scan.Clock(), "seed %d", seed)
		picks += int64(w.idx.Stats().VictimSearches)
		histories++
	}
	t.Logf("%d operations in %d histories, %d budget changes, %d victim choices compared with the exact scan", done, histories, changes, picks)
	require.Positive(t, changes)
}
