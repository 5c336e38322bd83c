package replay

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	rc "github.com/memscale/memscale/recompute"
)

// interleavedConstantsTrace is a forward pass of n layers whose parameters
// (constants of wSize bytes) arrive one layer at a time, each while the
// previous layer's activation (xSize bytes) is still live, followed by one
// op with a large output of bigSize bytes once every activation is gone.
func interleavedConstantsTrace(n, wSize, xSize, bigSize int) string {
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	out := func(name string, mem int) {
		line(`{"INSTRUCTION":"MEMORY","NAME":%q,"MEMORY":"%d"}`, name, mem)
		line(`{"INSTRUCTION":"ALIAS","NAME":%q,"ALIAS":"-1"}`, name)
	}
	line(`{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}`)
	line(`{"INSTRUCTION":"CONSTANT","NAME":"x0"}`)
	line(`{"INSTRUCTION":"MEMORY","NAME":"x0","MEMORY":"%d"}`, xSize)
	for i := 1; i <= n; i++ {
		line(`{"INSTRUCTION":"CONSTANT","NAME":"w%d"}`, i)
		line(`{"INSTRUCTION":"MEMORY","NAME":"w%d","MEMORY":"%d"}`, i, wSize)
		line(`{"INSTRUCTION":"CALL","NAME":"layer","ARGS":["w%d","x%d"],"RESULT":["x%d"],"TIME":"100"}`, i, i-1, i)
		out(fmt.Sprintf("x%d", i), xSize)
	}
	line(`{"INSTRUCTION":"CALL","NAME":"head","ARGS":["w1","x%d"],"RESULT":["y"],"TIME":"100"}`, n)
	out("y", bigSize)
	for i := 0; i <= n; i++ {
		line(`{"INSTRUCTION":"RELEASE","NAME":"x%d"}`, i)
	}
	return b.String()
}

// unpinnedModel is an allocator model that is never told a storage is
// pinned: every storage goes on the same stream, as before pinned storages
// were placed apart.
type unpinnedModel struct{ *AllocatorModel }

func (m unpinnedModel) Alloc(size uint64, _ bool) (Block, error) {
	return m.AllocatorModel.Alloc(size, false)
}

// TestPinnedStoragesPlacedApart replays layers whose parameters arrive one
// at a time between live activations. Placed in one stream, every parameter
// sits between activations, and pages shared with them can never be given
// back: the allocator runs out of room although the bytes in use fit. Placed
// on a stream of their own (the model is told they are pinned), the
// parameters pack together and the replay finishes.
func TestPinnedStoragesPlacedApart(t *testing.T) {
	tr, err := rc.ReadTrace(strings.NewReader(interleavedConstantsTrace(16, 5<<19, 3<<19, 8<<20)), rc.ParseOptions{})
	require.NoError(t, err)
	base, err := Run(tr, Options{})
	require.NoError(t, err)
	for _, ratio := range []float64{0.8, 0.9, 1} {
		budget := Budget(ratio, base.Peak)
		for _, tc := range []struct {
			name   string
			apart  bool
			status Status
		}{
			{"one stream", false, OOM},
			{"pinned apart", true, OK},
		} {
			name := fmt.Sprintf("%s/%.1f", tc.name, ratio)
			m, err := NewSimAllocatorModel(budget)
			require.NoError(t, err, name)
			var mm MemoryModel = m
			if !tc.apart {
				mm = unpinnedModel{m}
			}
			res, err := Run(tr, Options{Budget: budget, Memory: mm, Check: true})
			require.NoError(t, err, name)
			assert.Equal(t, tc.status, res.Status, "%s: %s", name, res.Reason)
			if tc.status == OOM {
				assert.Contains(t, res.Reason, "no room", name)
			}
			assert.Zero(t, m.Allocator().Allocated(), name)
			assert.NoError(t, m.Close(), name)
		}
	}
}
