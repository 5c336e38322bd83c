package evict

import (
	"testing"

	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// reclaimAll calls Reclaim(need) with room for capacity victims until it
// returns less than capacity, as the C ABI's callers do, and returns every
// victim written.
func reclaimAll(t *testing.T, e *Engine, need uint64, capacity int) []Victim {
	t.Helper()
	var all []Victim
	buf := make([]Victim, capacity)
	for calls := 0; ; calls++ {
		require.Less(t, calls, 1000, "Reclaim keeps returning a full out")
		n, err := e.Reclaim(need, buf)
		require.NoError(t, err)
		all = append(all, buf[:n]...)
		if n < len(buf) {
			return all
		}
	}
}

func victimBytes(vs []Victim) uint64 {
	var n uint64
	for _, v := range vs {
		n += v.Size
	}
	return n
}

func TestReclaim(t *testing.T) {
	// Every engine: a pinned parameter of 100 bytes and a chain of four
	// 200-byte outputs t1..t4, LRU (the oldest output goes first).
	tests := []struct {
		name   string
		budget uint64
		// release releases t4 first (banished: queued as pending) when the
		// engine has a budget.
		release bool
		// lock locks t1..t4 before the reclaim.
		lock     bool
		need     uint64
		capacity int
		// victims are the indices (into t1..t4) of the victims, in order.
		victims []int
		// short: the reclaim ends with a shortfall mentioning these words.
		short []string
	}{
		{name: "no budget: the oldest outputs until need is met", need: 300, capacity: 8, victims: []int{0, 1}},
		{name: "exactly one victim", need: 200, capacity: 8, victims: []int{0}},
		{name: "nothing asked, nothing pending", need: 0, capacity: 8},
		{name: "under a budget it does not need", budget: 1 << 40, need: 250, capacity: 8, victims: []int{0, 1}},
		{name: "a cap of one: three calls, one open reclaim", need: 500, capacity: 1, victims: []int{0, 1, 2}},
		{name: "pending first, counted toward need", budget: 1 << 40, release: true, need: 300, capacity: 8, victims: []int{3, 0}},
		{name: "pending only, need met by it", budget: 1 << 40, release: true, need: 150, capacity: 8, victims: []int{3}},
		{name: "more than there is", need: 10_000, capacity: 3, victims: []int{0, 1, 2, 3},
			short: []string{"reclaim of 10000 bytes found 800", "nothing more is evictable", "1 pinned", "0 locked"}},
		{name: "everything locked", lock: true, need: 1, capacity: 8,
			short: []string{"reclaim of 1 bytes found 0", "5 resident storages", "1 pinned", "4 locked (800 bytes"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var reasons []EvictReason
			e := newEngine(t, Config{Heuristic: LRU, Budget: tc.budget,
				OnEvict: func(_ Victim, why EvictReason) { reasons = append(reasons, why) }})
			x := e.NewTensor(100, true)
			ts := chain(t, e, x, 4, 200)
			if tc.release {
				require.NoError(t, e.Release(ts[3]))
				require.Equal(t, 1, e.Pending())
			}
			if tc.lock {
				for _, id := range ts {
					require.NoError(t, e.Lock(id))
				}
			}
			reasons = nil
			before := e.Stats()
			vs := reclaimAll(t, e, tc.need, tc.capacity)
			var got []rc.TensorID
			for _, v := range vs {
				got = append(got, v.Tensor)
			}
			var want []rc.TensorID
			for _, i := range tc.victims {
				want = append(want, ts[i])
			}
			assert.Equal(t, want, got)
			if tc.short == nil {
				assert.Empty(t, e.ReclaimShortfall())
				assert.GreaterOrEqual(t, victimBytes(vs), tc.need)
			} else {
				for _, w := range tc.short {
					assert.Contains(t, e.ReclaimShortfall(), w)
				}
			}
			chosen := int64(len(vs))
			if tc.release {
				chosen-- // the pending storage was not chosen by Reclaim
			}
			st := e.Stats()
			assert.Equal(t, chosen, st.ReclaimVictims-before.ReclaimVictims)
			assert.Equal(t, chosen, st.Evictions-before.Evictions)
			assert.Equal(t, uint64(chosen)*200, st.BytesEvicted-before.BytesEvicted)
			assert.Len(t, reasons, int(chosen))
			for _, r := range reasons {
				assert.Equal(t, ReasonReclaim, r)
			}
			assert.Equal(t, tc.budget, e.Budget(), "the budget is left as it was")
			for _, v := range vs {
				assert.False(t, e.Graph().IsResident(v.Tensor))
			}
		})
	}
}

func TestReclaimShortfallCounted(t *testing.T) {
	e := newEngine(t, Config{Heuristic: LRU})
	x := e.NewTensor(100, true)
	chain(t, e, x, 2, 200)
	var buf [4]Victim
	n, err := e.Reclaim(1000, buf[:])
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.Equal(t, int64(1), e.Stats().ReclaimShortfalls)
	assert.Contains(t, e.ReclaimShortfall(), "reclaim of 1000 bytes found 400")
	// A reclaim that finds what it asks for clears the reason.
	n, err = e.Reclaim(0, buf[:])
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Empty(t, e.ReclaimShortfall())
}

func TestReclaimErrorsAndClosing(t *testing.T) {
	e := newEngine(t, Config{Heuristic: LRU})
	x := e.NewTensor(100, true)
	ts := chain(t, e, x, 4, 200)

	n, err := e.Reclaim(100, nil)
	require.ErrorContains(t, err, "out has no room")
	assert.Zero(t, n)
	assert.True(t, e.Graph().IsResident(ts[0]), "nothing evicted")

	// A full out leaves the reclaim open: the next call counts what it wrote.
	var one [1]Victim
	n, err = e.Reclaim(400, one[:])
	require.NoError(t, err)
	require.Equal(t, 1, n)
	// An Evict in between closes it: the next Reclaim starts from 0 and
	// takes 400 bytes more (two victims).
	_, err = e.Evict(0, one[:])
	require.NoError(t, err)
	vs := reclaimAll(t, e, 400, 4)
	assert.Equal(t, []Victim{{Tensor: ts[1], Size: 200}, {Tensor: ts[2], Size: 200}}, vs)
}
