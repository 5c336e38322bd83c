package replay

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/memscale/memscale/evict"
	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// edgeTrace is a chain of n CALLs of the given TIME and output MEMORY whose
// intermediate outputs are released at the end.
func edgeTrace(n int, time int64, memory int64) string {
	var b strings.Builder
	b.WriteString(`{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}` + "\n")
	b.WriteString(`{"INSTRUCTION":"CONSTANT","NAME":"x0"}` + "\n")
	b.WriteString(`{"INSTRUCTION":"MEMORY","NAME":"x0","MEMORY":"` + strconv.FormatInt(memory, 10) + `"}` + "\n")
	for i := 1; i <= n; i++ {
		prev, cur := "x"+strconv.Itoa(i-1), "x"+strconv.Itoa(i)
		b.WriteString(`{"INSTRUCTION":"CALL","NAME":"f","ARGS":["` + prev + `"],"RESULT":["` + cur + `"],"TIME":"` + strconv.FormatInt(time, 10) + `"}` + "\n")
		b.WriteString(`{"INSTRUCTION":"MEMORY","NAME":"` + cur + `","MEMORY":"` + strconv.FormatInt(memory, 10) + `"}` + "\n")
		b.WriteString(`{"INSTRUCTION":"ALIAS","NAME":"` + cur + `","ALIAS":"-1"}` + "\n")
	}
	for i := 1; i < n; i++ {
		b.WriteString(`{"INSTRUCTION":"RELEASE","NAME":"x` + strconv.Itoa(i) + `"}` + "\n")
	}
	return b.String()
}

// TestReplayAtTheInt64Edges: issue 32's trace whose CALL TIMEs are 2^63-1
// spun forever with the default heuristic and reported overhead 0.000 and a
// negative base cost with others; every heuristic must finish, with the base
// compute saturated and an overhead of at least 1.
func TestReplayAtTheInt64Edges(t *testing.T) {
	for _, h := range evict.Heuristics() {
		for _, tm := range []int64{math.MaxInt64, math.MaxInt64 / 3} {
			tr, err := rc.ReadTrace(strings.NewReader(edgeTrace(12, tm, 1<<20)), rc.ParseOptions{})
			require.NoError(t, err)
			base, err := Run(tr, Options{Engine: evict.Config{Heuristic: h}})
			require.NoError(t, err)
			assert.Equal(t, int64(math.MaxInt64), base.BaseCompute, "%v time %d", h, tm)
			assert.GreaterOrEqual(t, base.Overhead, 0.999, "%v time %d", h, tm)
			res, err := Run(tr, Options{Engine: evict.Config{Heuristic: h}, Budget: Budget(0.5, base.Peak), OverheadLimit: -1})
			require.NoError(t, err, "%v time %d", h, tm)
			require.Equal(t, OK, res.Status, "%v time %d: %s", h, tm, res.Reason)
			assert.Positive(t, res.Evictions, "%v", h)
			assert.GreaterOrEqual(t, res.Compute, int64(0), "%v", h)
			assert.GreaterOrEqual(t, res.Overhead, 0.999, "%v", h)
			assert.LessOrEqual(t, res.Peak, base.Peak, "%v", h)
		}
	}
}

// TestReplayRefusesSizesAboveTheMaximum: a MEMORY of 2^63-1 replayed with a
// baseline peak of 2^64-2 bytes (issue 32); it is a parse error now.
func TestReplayRefusesSizesAboveTheMaximum(t *testing.T) {
	_, err := rc.ReadTrace(strings.NewReader(edgeTrace(3, 10, math.MaxInt64)), rc.ParseOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "9223372036854775807")
	assert.Contains(t, err.Error(), "maximum storage size of 281474976710656")
	// at the maximum the peak is exact
	tr, err := rc.ReadTrace(strings.NewReader(edgeTrace(3, 10, rc.MaxSize)), rc.ParseOptions{})
	require.NoError(t, err)
	res, err := Run(tr, Options{})
	require.NoError(t, err)
	assert.Equal(t, uint64(4*rc.MaxSize), res.Peak)
}
