package replay

import (
	"testing"

	"github.com/memscale/memscale/internal/sharedtraces"
	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/require"
)

func loadTrace(t testing.TB, path string) *rc.Trace {
	t.Helper()
	tr, err := rc.LoadTrace(path)
	require.NoError(t, err)
	return tr
}

// TestBaselineExact checks that an unlimited-budget replay reproduces the
// baseline of the DTR authors' simulator exactly.
func TestBaselineExact(t *testing.T) {
	want := map[string]struct {
		peak    uint64
		compute int64
	}{
		"resnet32":       {10061179152, 291905487},
		"tv_densenet121": {11020749360, 355299140},
		"transformer":    {9864405000, 276259118},
		"lstm":           {5595127736, 769458833},
		"unet":           {8415764640, 435278292},
	}
	for _, tc := range sharedtraces.ForTest(t) {
		t.Run(tc.Name, func(t *testing.T) {
			w, ok := want[tc.Name]
			require.True(t, ok, "no expected baseline for %s", tc.Name)
			tr := loadTrace(t, tc.Path)
			res, err := Run(tr, Options{Check: true})
			require.NoError(t, err)
			require.Equal(t, OK, res.Status)
			require.Equal(t, w.peak, res.Peak, "peak bytes")
			require.Equal(t, w.compute, res.Compute, "compute ns")
			require.Equal(t, w.compute, res.BaseCompute)
			require.Zero(t, res.Evictions)
			require.Zero(t, res.Rematerializations)
		})
	}
}
