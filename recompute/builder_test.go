package recompute

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBuilderErrorsRecordNothing(t *testing.T) {
	var b Builder
	w := b.Constant(10)
	ys, err := b.Call("mm", []int32{w}, []OutSpec{{Size: 20, Alias: -1}, {Alias: 0}}, 5)
	require.NoError(t, err)
	require.Equal(t, []int32{1, 2}, ys)
	require.NoError(t, b.Release(ys[0]))
	n := b.Len()
	for _, tc := range []struct {
		name string
		do   func() error
		want string
	}{
		{"call unknown", func() error { _, err := b.Call("f", []int32{7}, nil, 1); return err }, "unknown tensor 7"},
		{"call released", func() error { _, err := b.Call("f", []int32{ys[0]}, nil, 1); return err }, "no references left"},
		{"alias out of range", func() error { _, err := b.Call("f", []int32{w}, []OutSpec{{Alias: 1}}, 1); return err }, "aliases argument 1 of 1"},
		{"mutate index", func() error { _, err := b.Mutate("f_", []int32{w}, []int{1}, 1); return err }, "mutated index 1 out of range"},
		{"copy negative", func() error { return b.Copy(-1) }, "unknown tensor -1"},
		{"release twice", func() error { return b.Release(ys[0]) }, "no references left"},
		{"pin released", func() error { return b.Pin(ys[0]) }, "no references left"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorContains(t, tc.do(), tc.want)
			require.Equal(t, n, b.Len(), "nothing recorded")
		})
	}
	tr := b.Trace()
	require.Equal(t, []int32{0, 2}, tr.Outputs)
	require.Equal(t, []string{"t0", "t1", "t2"}, tr.Names)
	require.Equal(t, uint64(0), tr.At(1).Outs[1].Size, "an alias has no size of its own")
	require.Equal(t, "PIN", KindPin.String())
	// the returned trace does not change when either goes on
	n = tr.Len()
	require.NoError(t, tr.Append(Instr{Kind: KindRelease, T: 0}))
	b.Constant(5)
	require.Equal(t, n+1, b.Len())
	require.Equal(t, Instr{Kind: KindRelease, T: 0}, tr.At(n))
	require.Equal(t, Instr{Kind: KindConstant, Line: n + 1, T: 3, Size: 5}, b.Trace().At(n))
	require.Equal(t, uint64(10), b.Trace().At(0).Size)
}
