package sweep

import (
	"fmt"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	rc "github.com/memscale/memscale/recompute"

	"github.com/memscale/memscale/replay"
)

// TestRecordedSamplesReplay checks the project's own sample traces
// (samples/traces, recorded from transformers models by the Python trace
// recorder) through the Go side: they parse, their baseline is positive, and
// the engine keeps them within half and a third of their peak with every
// invariant checked after each instruction.
func TestRecordedSamplesReplay(t *testing.T) {
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	paths, err := filepath.Glob(filepath.Join(filepath.Dir(file), "..", "..", "samples", "traces", "*.log.gz"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(paths), 2, "samples/traces should hold the GPT-2 and BERT traces")
	for _, path := range paths {
		tr, err := rc.LoadTrace(path)
		require.NoError(t, err, path)
		base, err := replay.Run(tr, replay.Options{})
		require.NoError(t, err, path)
		require.True(t, base.Feasible(), "%s baseline: %s", path, base.Reason)
		require.Positive(t, base.Peak)
		require.Positive(t, base.BaseCompute)
		for _, ratio := range []float64{0.5, 0.3} {
			t.Run(fmt.Sprintf("%s/%.1f", filepath.Base(path), ratio), func(t *testing.T) {
				budget := replay.Budget(ratio, base.Peak)
				res, err := replay.Run(tr, replay.Options{Budget: budget, Check: true, OverheadLimit: -1})
				require.NoError(t, err)
				require.True(t, res.Feasible(), "status %s: %s", res.Status, res.Reason)
				require.LessOrEqual(t, res.Peak, budget)
				require.Positive(t, res.Evictions)
				require.GreaterOrEqual(t, res.Overhead, 1.0)
			})
		}
	}
}
