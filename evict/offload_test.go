package evict

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	rc "github.com/memscale/memscale/recompute"
)

// TestOffloadLimit checks Config.OffloadLimit: swaps stop at the cap, a
// recomputable victim is dropped instead, one that cannot be recomputed is
// not taken, and swapping back in makes room for the next swap.
func TestOffloadLimit(t *testing.T) {
	e := newEngine(t, Config{SwapBandwidth: 1e15, Heuristic: LRU, OffloadLimit: 1500})
	x := e.NewTensor(100, true)
	ts := chain(t, e, x, 3, 1000) // recomputable, but swapping is cheaper on this link
	ext := e.NewTensor(1000, false)
	e.SetBudget(e.Usage() - 2500)
	vs := evictAll(t, e, 0)
	actions := map[Action]int{}
	for _, v := range vs {
		actions[v.Action]++
		require.NotEqual(t, ext, v.Tensor, "the external cannot be recomputed and would pass the cap")
	}
	assert.Equal(t, map[Action]int{Swap: 1, Drop: 2}, actions, "%v", vs)
	assert.Equal(t, uint64(1000), e.Graph().SwappedBytes())
	assert.LessOrEqual(t, e.Graph().SwappedBytes(), uint64(1500))

	// Swap the swapped one back in: the external fits under the cap again.
	for _, v := range vs {
		if v.Action == Swap {
			require.NoError(t, e.SwappedIn(v.Tensor))
		}
	}
	assert.Equal(t, uint64(0), e.Graph().SwappedBytes())
	e.SetBudget(e.Usage() - 1000)
	vs = evictAll(t, e, 0)
	var swapped []rc.TensorID
	for _, v := range vs {
		if v.Action == Swap {
			swapped = append(swapped, v.Tensor)
		}
	}
	require.NotEmpty(t, swapped)
	assert.LessOrEqual(t, e.Graph().SwappedBytes(), uint64(1500))
	_ = ts

	// Nothing but a capped external left: the error says why.
	e = newEngine(t, Config{SwapBandwidth: 1e15, OffloadLimit: 500, Budget: 50})
	e.NewTensor(1000, false)
	_, err := e.Evict(0, make([]Victim, 1))
	require.ErrorIs(t, err, ErrNoEvictable)
	require.ErrorContains(t, err, "1 not recomputable whose swap would pass the offload limit of 500 bytes (0 swapped out)")

	// The key round-trips through the JSON configuration.
	cfg, _, err := Defaults{}.Decode([]byte(`{"offload_limit": 4096, "swap_bandwidth": 1e9}`))
	require.NoError(t, err)
	assert.Equal(t, uint64(4096), cfg.OffloadLimit)
	assert.EqualValues(t, 4096, cfg.JSON(UsageSource{})["offload_limit"])
}
