package evict

import (
	"testing"

	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/require"
)

func TestRecordingStopsWhenFull(t *testing.T) {
	e, err := New(Config{Heuristic: Auto})
	require.NoError(t, err)
	require.Equal(t, AncSqrt, e.Heuristic(), "auto scores with the default heuristic")
	e.rec.limit = 10
	x := e.NewTensor(8, true)
	for i := 0; i < 20; i++ {
		_, ys, err := e.Call("op", []rc.TensorID{x}, []Output{{Size: 8, Alias: -1}}, 1, 0)
		require.NoError(t, err, "the engine goes on when the recording stops")
		x = ys[0]
	}
	_, err = e.Recording()
	require.ErrorContains(t, err, "recording stopped after 10 instructions")
	require.ErrorContains(t, err, "longer than 10 instructions")
	require.Nil(t, e.rec.ids, "a stopped recording keeps nothing")
}

func TestRecordingStopsAtAnInconsistency(t *testing.T) {
	e, err := New(Config{Record: true})
	require.NoError(t, err)
	x := e.NewTensor(8, true)
	e.rec.ids[x] = 99 // the recording lost track of x
	_, _, err = e.Call("op", []rc.TensorID{x}, []Output{{Size: 8, Alias: -1}}, 1, 0)
	require.NoError(t, err)
	_, err = e.Recording()
	require.ErrorContains(t, err, "recording stopped after 1 instructions")
	require.ErrorContains(t, err, "unknown tensor 99")
}
