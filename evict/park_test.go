package evict

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	rc "github.com/memscale/memscale/recompute"
)

func TestParkTakesALockedStorageOutAndPlansItsSwapIn(t *testing.T) {
	var why []EvictReason
	e := newEngine(t, Config{Heuristic: LRU, Park: true, SwapBandwidth: 1e9,
		OnEvict: func(_ Victim, r EvictReason) { why = append(why, r) }})
	x := e.NewTensor(100, true)
	ts := chain(t, e, x, 2, 1000) // x -> a -> b
	a, b := ts[0], ts[1]
	require.NoError(t, e.Lock(a))
	e.SetBudget(1100)
	n, err := e.Evict(1000, make([]Victim, 4))
	require.NoError(t, err)
	require.Equal(t, 1, n, "b goes")
	_, err = e.Evict(1000, make([]Victim, 4))
	require.ErrorIs(t, err, ErrNoEvictable, "a is locked: no room for 1000 more")

	parked, err := e.Park(a)
	require.NoError(t, err)
	require.True(t, parked)
	assert.Equal(t, rc.Swapped, e.Graph().StorageOf(a).State)
	assert.Equal(t, int32(1), e.Graph().StorageOf(a).Locks, "the lock stays")
	assert.Equal(t, []EvictReason{ReasonBudget, ReasonPark}, why)
	s := e.Stats()
	assert.Equal(t, int64(1), s.Parked)
	assert.Equal(t, int64(1), s.SwapsOut)
	assert.Equal(t, int64(1000), s.SwapCostNS, "1000 bytes at 1 GB/s")
	assert.Equal(t, uint64(100), e.Usage())
	assert.Empty(t, evictAll(t, e, 1000), "room now")

	// Parking it again, or a pinned or unknown tensor, parks nothing.
	for _, tc := range []struct {
		name string
		t    rc.TensorID
	}{{"swapped", a}, {"pinned", x}, {"evicted", b}} {
		parked, err := e.Park(tc.t)
		require.NoError(t, err, tc.name)
		assert.False(t, parked, tc.name)
	}
	_, err = e.Park(99)
	require.ErrorContains(t, err, "park")

	// The holder brings it back with a plan of one swap-in step.
	steps, err := e.Plan(a, nil)
	require.NoError(t, err)
	require.Equal(t, []rc.Step{{Kind: rc.StepSwapIn, Tensor: a}}, steps)
	require.NoError(t, e.HoldPlan(steps))
	require.NoError(t, e.SwappedIn(a))
	assert.True(t, e.Graph().IsResident(a))
	require.NoError(t, e.Unlock(a))
	assert.Equal(t, 1, e.Candidates(), "a is a candidate again once unlocked")
}

func TestParkIsOffByDefaultAndKeepsTheOffloadLimit(t *testing.T) {
	e := newEngine(t, Config{Heuristic: LRU})
	x := e.NewTensor(100, true)
	a := chain(t, e, x, 1, 1000)[0]
	parked, err := e.Park(a)
	require.NoError(t, err)
	assert.False(t, parked, "parking is off by default")

	e = newEngine(t, Config{Heuristic: LRU, Park: true, OffloadLimit: 500})
	x = e.NewTensor(100, true)
	a = chain(t, e, x, 1, 1000)[0]
	parked, err = e.Park(a)
	require.NoError(t, err)
	assert.False(t, parked, "1000 bytes would pass the offload limit of 500")

	cfg, _, err := Defaults{}.Decode([]byte(`{"park": true}`))
	require.NoError(t, err)
	assert.True(t, cfg.Park)
	assert.Equal(t, true, cfg.JSON(UsageSource{})["park"])
	_, _, err = Defaults{}.Decode([]byte(`{"park": 1}`))
	require.ErrorContains(t, err, "park")
}

func TestReserveVictimsAreParked(t *testing.T) {
	// A plan [a b c] with c = g(b, x2): while the first step runs, x2 (an
	// input of the last step) is only soft-held. When nothing else is left
	// it is taken - parked (swapped) with parking on, dropped without.
	for _, park := range []bool{false, true} {
		cfg := Config{Heuristic: LRU}
		if park {
			cfg.Park = true
		}
		e := newEngine(t, cfg)
		x := e.NewTensor(100, true)
		a := chain(t, e, x, 1, 100)[0]
		_, bs, err := e.Call("f", []rc.TensorID{a}, []Output{{Size: 100, Alias: -1}}, 10, 0)
		require.NoError(t, err)
		_, x2s, err := e.Call("k", []rc.TensorID{x}, []Output{{Size: 100, Alias: -1}}, 1e6, 0)
		require.NoError(t, err)
		_, cs, err := e.Call("g", []rc.TensorID{bs[0], x2s[0]}, []Output{{Size: 100, Alias: -1}}, 10, 0)
		require.NoError(t, err)
		require.NoError(t, e.Lock(x2s[0]))
		e.SetBudget(200)
		evictAll(t, e, 0) // a, b, c go; x2 is locked
		require.NoError(t, e.Unlock(x2s[0]))
		e.SetBudget(1000)
		steps, err := e.Plan(cs[0], nil)
		require.NoError(t, err)
		require.Len(t, steps, 3)
		require.NoError(t, e.HoldPlan(steps))
		e.SetBudget(150) // x (pinned) + x2: x2, soft-held, is the only candidate
		vs := evictAll(t, e, 0)
		require.Len(t, vs, 1)
		assert.Equal(t, x2s[0], vs[0].Tensor)
		want, parked := Drop, int64(0)
		if park {
			want, parked = Swap, 1
		}
		assert.Equal(t, want, vs[0].Action, "park=%v", park)
		assert.Equal(t, parked, e.Stats().Parked)
		assert.Equal(t, int64(1), e.Stats().ReserveEvictions)
	}
}
