package replay

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/evict"
	rc "github.com/memscale/memscale/recompute"
)

// TestAllocatorModelEndsEmpty replays a chain in an allocator for every
// heuristic and several budgets, finishing or not: every block the replay
// placed is freed when it ends, so closing the model reports nothing live.
func TestAllocatorModelEndsEmpty(t *testing.T) {
	const size = 4 << 20
	tr, err := rc.ReadTrace(strings.NewReader(chainTrace(12, size)), rc.ParseOptions{})
	require.NoError(t, err)
	base, err := Run(tr, Options{})
	require.NoError(t, err)
	statuses := map[Status]int{}
	for _, h := range append([]evict.Heuristic{evict.Default}, evict.Heuristics()...) {
		for _, plans := range []bool{false, true} {
			for _, ratio := range []float64{0.1, 0.3, 0.5, 0.8, 1} {
				name := fmt.Sprintf("%s/plans=%v/%.1f", h, plans, ratio)
				budget := Budget(ratio, base.Peak)
				m, err := NewSimAllocatorModel(budget)
				require.NoError(t, err, name)
				res, err := Run(tr, Options{Budget: budget, Memory: m, Plans: plans, Check: true, Engine: evict.Config{Heuristic: h}})
				require.NoError(t, err, name)
				statuses[res.Status]++
				assert.Equal(t, "allocator", res.Memory, name)
				assert.Zero(t, m.Allocator().Allocated(), "%s: %s, bytes still allocated when the replay returned", name, res.Status)
				assert.NoError(t, m.Close(), "%s: %s", name, res.Status)
			}
		}
	}
	t.Logf("statuses: %v", statuses)
	assert.Positive(t, statuses[OK], "some runs finish")
	assert.Positive(t, statuses[OOM]+statuses[OverLimit], "some runs stop early")
}

// cappedMemory is a placing memory model with a hard capacity (below the
// engine's budget) that tracks the blocks it has handed out.
type cappedMemory struct {
	capacity, used, peak uint64
	live                 map[Block]uint64
	next                 Block
}

func (m *cappedMemory) Name() string               { return "capped" }
func (m *cappedMemory) UsageSource() func() uint64 { return nil }
func (m *cappedMemory) Peak() uint64               { return m.peak }
func (m *cappedMemory) Alloc(size uint64, _ bool) (Block, error) {
	if m.used+size > m.capacity {
		return 0, fmt.Errorf("%d bytes with %d of %d in use: %w", size, m.used, m.capacity, ErrNoRoom)
	}
	m.next++
	m.live[m.next] = size
	m.used += size
	m.peak = max(m.peak, m.used)
	return m.next, nil
}
func (m *cappedMemory) Free(b Block) error {
	s, ok := m.live[b]
	if !ok {
		return fmt.Errorf("unknown block %d", b)
	}
	delete(m.live, b)
	m.used -= s
	return nil
}

// TestStopMidPlacementFreesBlocks stops a run while an op's outputs are
// being placed: the first output's block is placed, the second does not fit
// and nothing is evictable (the op's input is locked). The block placed for
// the op that never ran is freed with the rest.
func TestStopMidPlacementFreesBlocks(t *testing.T) {
	trace := strings.Join([]string{
		`{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}`,
		`{"INSTRUCTION":"CONSTANT","NAME":"a"}`,
		`{"INSTRUCTION":"MEMORY","NAME":"a","MEMORY":"100"}`,
		`{"INSTRUCTION":"CALL","NAME":"split","ARGS":["a"],"RESULT":["b","c"],"TIME":"10"}`,
		`{"INSTRUCTION":"MEMORY","NAME":"b","MEMORY":"100"}`,
		`{"INSTRUCTION":"ALIAS","NAME":"b","ALIAS":"-1"}`,
		`{"INSTRUCTION":"MEMORY","NAME":"c","MEMORY":"100"}`,
		`{"INSTRUCTION":"ALIAS","NAME":"c","ALIAS":"-1"}`,
	}, "\n")
	tr, err := rc.ReadTrace(strings.NewReader(trace), rc.ParseOptions{})
	require.NoError(t, err)
	m := &cappedMemory{capacity: 250, live: map[Block]uint64{}}
	res, err := Run(tr, Options{Budget: 300, Memory: m})
	require.NoError(t, err)
	require.Equal(t, OOM, res.Status, "the second output cannot be placed")
	assert.Contains(t, res.Reason, "placing 100 bytes")
	assert.Equal(t, uint64(200), m.Peak(), "the input and the first output were placed")
	assert.Empty(t, m.live, "every placed block is freed when the run stops")
	assert.Zero(t, m.used)
}
