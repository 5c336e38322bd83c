package recompute

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestIDArenaSlicesNeverReachTheirNeighbours(t *testing.T) {
	var a idArena[TensorID]
	first := a.clone([]TensorID{1, 2, 3})
	second := a.take(2)
	require.Equal(t, []TensorID{1, 2, 3}, first)
	require.Equal(t, []TensorID{0, 0}, second)
	assert.Equal(t, len(first), cap(first), "capacity capped at the length")

	grown := append(first, 4) // copies: the arena's next ids stay untouched
	grown[0] = 9
	second[0], second[1] = 7, 8
	assert.Equal(t, []TensorID{1, 2, 3}, first)
	assert.Equal(t, []TensorID{9, 2, 3, 4}, grown)
	assert.Equal(t, []TensorID{7, 8}, second)
}

func TestIDArenaTakeSizes(t *testing.T) {
	cases := []struct {
		name string
		n    int
	}{
		{"none", 0},
		{"one", 1},
		{"a chunk's quarter", arenaChunk / 4},
		{"larger: its own allocation", arenaChunk/4 + 1},
		{"larger than a chunk", 2 * arenaChunk},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var a idArena[StorageID]
			s := a.take(c.n)
			assert.Len(t, s, c.n)
			assert.Equal(t, c.n, cap(s))
			if c.n == 0 {
				assert.Nil(t, s)
			}
		})
	}
}

func TestIDArenaAppendToStartsInTheArenaThenGrows(t *testing.T) {
	var a idArena[StorageID]
	var kids []StorageID
	for i := range StorageID(5) {
		kids = a.appendTo(kids, i)
	}
	next := a.take(1)
	next[0] = 42
	assert.Equal(t, []StorageID{0, 1, 2, 3, 4}, kids)

	// Many slices across chunk boundaries keep their own values.
	var all [][]StorageID
	for i := range 3 * arenaChunk {
		all = append(all, a.appendTo(nil, StorageID(i)))
	}
	for i, s := range all {
		require.Equal(t, []StorageID{StorageID(i)}, s)
	}
}

// An op's registration allocates nothing of its own once the graph's arrays
// are reserved (AllocsPerRun truncates the average: one chunk per thousand
// ops counts zero); before the arena, four objects per op.
func TestAddOpAllocatesNothingPerOpWhenReserved(t *testing.T) {
	g := NewGraph()
	const n = 2000
	g.Reserve(n+2, n+2, n+2)
	prev, err := g.AddExternal(100, 0)
	require.NoError(t, err)
	outs := []OutSpec{{Size: 100, Alias: -1}}
	allocs := testing.AllocsPerRun(n, func() {
		op, err := g.AddOp("chain", []TensorID{prev}, outs, 1, 0, 0)
		if err != nil {
			panic(err)
		}
		prev = g.Op(op).Outputs[0]
	})
	assert.Zero(t, allocs, "objects allocated per op")
}
