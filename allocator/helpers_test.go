package allocator

import (
	"slices"
	"testing"

	"github.com/memscale/memscale/device"
	"github.com/stretchr/testify/require"
)

func ptr(p uint64) device.Ptr { return device.Ptr(p) }

// liveAtBudget is a test workload's live blocks under a budget, as a DTR
// engine keeps them: before each request it frees blocks until the request
// fits, then allocates.
type liveAtBudget struct {
	ptrs  []device.Ptr
	sizes []uint64 // what the engine counts for each (may differ from what was asked)
	used  uint64
}

// alloc frees the blocks victim picks (given how many are live) until size
// fits budget, then allocates asked bytes counted as size.
func (l *liveAtBudget) alloc(t *testing.T, a *Allocator, budget, size, asked uint64, victim func(n int) int) {
	t.Helper()
	for l.used+size > budget {
		j := victim(len(l.ptrs))
		require.NoError(t, a.Free(l.ptrs[j]))
		l.used -= l.sizes[j]
		l.ptrs = slices.Delete(l.ptrs, j, j+1)
		l.sizes = slices.Delete(l.sizes, j, j+1)
	}
	p, err := a.Malloc(asked, 1)
	require.NoError(t, err)
	l.ptrs = append(l.ptrs, p)
	l.sizes = append(l.sizes, size)
	l.used += size
}

// freeAll frees ptrs.
func freeAll(t *testing.T, a *Allocator, ptrs []device.Ptr) {
	t.Helper()
	for _, p := range ptrs {
		require.NoError(t, a.Free(p))
	}
}
