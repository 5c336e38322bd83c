package evict

import (
	"errors"
	"testing"

	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEvictExtraLargerThanBudget(t *testing.T) {
	tests := []struct {
		name  string
		extra uint64
		// tooLarge: Evict fails at once with a *TooLargeError.
		tooLarge bool
		// victims handed out (the pending one first) when it does not.
		victims int
	}{
		{"one byte over the budget", 1001, true, 0},
		{"far over the budget", 1 << 40, true, 0},
		{"the whole budget", 1000, false, 3},
		{"nothing extra", 0, false, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, Config{Heuristic: LRU, Budget: 1000})
			x := e.NewTensor(100, true)
			ts := chain(t, e, x, 3, 200)
			require.NoError(t, e.Release(ts[2])) // banished: queued for the next Evict
			require.Equal(t, 1, e.Pending())
			usage := e.Usage()
			var buf [8]Victim
			n, err := e.Evict(tc.extra, buf[:])
			if !tc.tooLarge {
				require.NoError(t, err)
				assert.Equal(t, tc.victims, n)
				return
			}
			require.Error(t, err)
			assert.Zero(t, n)
			var tl *TooLargeError
			require.True(t, errors.As(err, &tl), "%v", err)
			assert.Equal(t, TooLargeError{Extra: tc.extra, Budget: 1000, Pinned: 100, PinnedAtRegistration: 100,
				MinBudget: MinBudgetParts{PinnedAtRegistration: 100, OpBytes: tc.extra, Op: pointOp}}, *tl)
			assert.Equal(t, 100+tc.extra, e.Stats().MinBudget, "the request is a bound: the step's minimum budget")
			assert.ErrorIs(t, err, ErrNoEvictable, "replays count it as out of memory")
			assert.ErrorContains(t, err, "evict: budget 1000 B is below what this step needs at this point: "+
				"100 B pinned at registration (parameters, inputs) + 0 B pinned later (gradients) + "+
				"0 B locked by the running op + ")
			assert.ErrorContains(t, err, "; an allocation of")
			assert.ErrorContains(t, err, "is larger than the whole budget of 1000 bytes: raise the budget above")
			assert.ErrorContains(t, err, "plus the pinned bytes (100 now)")
			// nothing was evicted, nothing handed out
			assert.Equal(t, usage, e.Usage())
			assert.Equal(t, 1, e.Pending())
			assert.Zero(t, e.Stats().Evictions)
			assert.True(t, e.Graph().IsResident(ts[0]))
		})
	}
}

func TestFinish(t *testing.T) {
	e := newEngine(t, Config{Heuristic: LRU, Budget: 250})
	x := e.NewTensor(100, true)
	ts := chain(t, e, x, 2, 100)
	require.NoError(t, e.Lock(ts[0]))
	var buf [4]Victim
	// room for 100 more: ts[1] goes, then nothing is left and usage is
	// still over the budget
	n, err := e.Evict(100, buf[:])
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Equal(t, ts[1], buf[0].Tensor)
	_, err = e.Evict(100, buf[:])
	require.ErrorIs(t, err, ErrNoEvictable)
	_, err = e.Evict(251, buf[:])
	var tl *TooLargeError
	require.ErrorAs(t, err, &tl)
	assert.False(t, e.Finished())
	assert.False(t, e.Stats().Finished)

	e.Finish()
	e.Finish() // twice changes nothing
	assert.True(t, e.Finished())
	assert.True(t, e.Stats().Finished)
	// the budget still binds: what leaves the step must fit, and the error
	// says that it is what leaves the step
	_, err = e.Evict(100, buf[:])
	require.ErrorIs(t, err, ErrNoEvictable)
	assert.Contains(t, err.Error(), "is below what leaves this step: 100 B pinned at registration (parameters, inputs) + "+
		"0 B pinned later (gradients) + 100 B resident and 100 B to make resident of the tensors the step hands back")
	assert.Contains(t, err.Error(), "the step's minimum budget so far is 451 B (an earlier point that found no room)")
	_, err = e.Evict(300, buf[:])
	require.ErrorAs(t, err, &tl)
	assert.True(t, tl.Finished)
	assert.Contains(t, tl.Error(), "the step's minimum budget so far is 500 B (this point)")
	assert.Equal(t, MinBudgetParts{PinnedAtRegistration: 100, OpBytes: 300 + 100, Op: leaveOp}, e.MinBudget(),
		"the failed request's need is the step's minimum budget")
	n, err = e.Evict(0, buf[:])
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Equal(t, uint64(200), e.Usage(), "nothing was made resident over the budget")
}

func TestBytesEvictedAndPending(t *testing.T) {
	e := newEngine(t, Config{Heuristic: LRU, Budget: 1 << 30})
	x := e.NewTensor(100, true)
	ts := chain(t, e, x, 3, 100)
	require.NoError(t, e.Release(ts[0])) // eager eviction (ts[1] is its live child)
	require.NoError(t, e.Release(ts[2])) // banished
	assert.Equal(t, 2, e.Pending())
	vs := evictAll(t, e, 0)
	require.Len(t, vs, 2)
	assert.Zero(t, e.Pending())
	assert.Zero(t, e.Stats().BytesEvicted, "eager evictions and banished storages are not budget victims")
	e.SetBudget(150)
	vs = evictAll(t, e, 0)
	require.Equal(t, []Victim{{Tensor: ts[1], Action: Drop, Size: 100}}, vs)
	assert.Equal(t, uint64(100), e.Stats().BytesEvicted)

	// swaps out count too
	e = newEngine(t, Config{SwapBandwidth: 1e15, Heuristic: LRU})
	x = e.NewTensor(100, true)
	chain(t, e, x, 2, 1000)
	e.SetBudget(1100)
	vs = evictAll(t, e, 0)
	require.Len(t, vs, 1)
	require.Equal(t, Swap, vs[0].Action)
	st := e.Stats()
	assert.Equal(t, uint64(1000), st.BytesEvicted)
	assert.Equal(t, int64(1), st.SwapsOut)
	_, err := e.EvictOne()
	require.NoError(t, err)
	assert.Equal(t, uint64(2000), e.Stats().BytesEvicted, "EvictOne's victims are budget victims")
	assert.Equal(t, rc.Swapped, e.Graph().StorageOf(vs[0].Tensor).State)
}
