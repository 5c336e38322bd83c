package nativemodel

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHugeRequestsAreOutOfMemory: `memscale bench replay` segfaulted on any
// allocation >= 2^48 bytes (a nil block in tryAllocateExpandable, issue 32).
// Every configuration answers a request it cannot place with an error
// wrapping ErrOutOfMemory, counts the OOM, and keeps serving normal sizes.
func TestHugeRequestsAreOutOfMemory(t *testing.T) {
	for _, exp := range []bool{false, true} {
		for _, capacity := range []uint64{0, 1 << 30} {
			for _, size := range []uint64{1 << 41, MaxSize, MaxSize + 1, 1 << 62, math.MaxUint64 - 1, math.MaxUint64} {
				name := fmt.Sprintf("expandable=%v capacity=%d size=%d", exp, capacity, size)
				m := New(Config{ExpandableSegments: exp, Capacity: capacity})
				addr, err := m.Malloc(size, 0)
				fits := size <= MaxSize && capacity == 0 && (!exp || size <= 1<<40)
				if fits {
					require.NoError(t, err, name)
					require.NoError(t, m.Free(addr), name)
				} else {
					require.ErrorIs(t, err, ErrOutOfMemory, name)
					assert.Contains(t, err.Error(), fmt.Sprint(size), name)
					assert.Equal(t, int64(1), m.Stats().NumOOMs, name)
				}
				a, err := m.Malloc(1<<20, 0)
				require.NoError(t, err, name)
				require.NoError(t, m.Free(a), name)
			}
		}
	}
}
