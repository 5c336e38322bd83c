package replay

import (
	"testing"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/sharedtraces"
	rc "github.com/memscale/memscale/recompute"
	"github.com/stretchr/testify/require"
)

// TestRecordingReplaysIdentically checks the engine's recording against the
// trace it was driven by: replaying the recording under the same budget and
// configuration gives the same baseline, the same overhead and the same
// counters, for every heuristic at a tight and a loose budget.
func TestRecordingReplaysIdentically(t *testing.T) {
	for _, tc := range sharedtraces.ForTest(t) {
		t.Run(tc.Name, func(t *testing.T) {
			tr := loadTrace(t, tc.Path)
			base, err := Run(tr, Options{Record: true})
			require.NoError(t, err)
			require.NotNil(t, base.Recording)
			rbase, err := Run(base.Recording, Options{})
			require.NoError(t, err)
			require.Equal(t, base.Peak, rbase.Peak, "baseline peak")
			require.Equal(t, base.BaseCompute, rbase.BaseCompute, "baseline compute")
			for _, h := range []evict.Heuristic{evict.Default, evict.DTR, evict.MSPS} {
				for _, ratio := range []float64{0.4, 0.8} {
					opt := Options{Budget: Budget(ratio, base.Peak), Engine: evict.Config{Heuristic: h}}
					opt.Record = true
					first, err := Run(tr, opt)
					require.NoError(t, err)
					opt.Record = false
					again, err := Run(first.Recording, opt)
					require.NoError(t, err)
					require.Equal(t, first.Status, again.Status, "%s %.1f", h, ratio)
					require.Equal(t, first.Compute, again.Compute, "%s %.1f compute", h, ratio)
					require.Equal(t, first.Evictions, again.Evictions, "%s %.1f evictions", h, ratio)
					require.Equal(t, first.Rematerializations, again.Rematerializations, "%s %.1f remats", h, ratio)
				}
			}
		})
	}
}

// TestRecordingKinds checks what each engine call becomes in the recording.
func TestRecordingKinds(t *testing.T) {
	e, err := evict.New(evict.Config{Record: true})
	require.NoError(t, err)
	w := e.NewTensor(100, true)
	x := e.NewTensor(50, false)
	_, ys, err := e.Call("mm", []rc.TensorID{w, x}, []evict.Output{{Size: 80, Alias: -1}, {Alias: 1}}, 7, 0)
	require.NoError(t, err)
	require.NoError(t, e.Retain(ys[0]))
	_, zs, err := e.Mutate("relu_", []rc.TensorID{ys[0]}, []int{0}, 3, 0)
	require.NoError(t, err)
	require.NoError(t, e.Pin(zs[0]))
	require.NoError(t, e.Release(ys[0]))
	require.NoError(t, e.Release(ys[1]))
	require.NoError(t, e.Access(x)) // not part of the program
	tr, err := e.Recording()
	require.NoError(t, err)
	var kinds []rc.Kind
	for _, in := range tr.All() {
		kinds = append(kinds, in.Kind)
	}
	require.Equal(t, []rc.Kind{rc.KindConstant, rc.KindConstant, rc.KindCall, rc.KindCopy, rc.KindMutate, rc.KindPin,
		rc.KindRelease, rc.KindRelease}, kinds)
	call := tr.At(2)
	require.Equal(t, []int32{0, 1}, call.Args)
	require.Equal(t, []rc.Out{{T: 2, Size: 80, Alias: -1}, {T: 3, Size: 0, Alias: 1}}, call.Outs)
	require.Equal(t, int64(7), call.Time)
	mut := tr.At(4)
	require.Equal(t, []int32{0}, mut.Mutated)
	require.Equal(t, []rc.Out{{T: 4, Size: 80, Alias: -1}}, mut.Outs)
	// w, x and the new version are still referenced.
	require.Equal(t, []int32{0, 1, 4}, tr.Outputs)
	res, err := Run(tr, Options{Check: true})
	require.NoError(t, err)
	require.Equal(t, OK, res.Status)

	plain, err := evict.New(evict.Config{})
	require.NoError(t, err)
	_, err = plain.Recording()
	require.ErrorContains(t, err, "Config.Record is off")
}
