package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSmoke(t *testing.T) {
	for _, vmm := range []bool{true, false} {
		d := newFakeDevice(8<<30, 2<<20, vmm)
		a, err := New(Config{Device: d})
		require.NoError(t, err)
		var ps []uint64
		for _, sz := range []uint64{0, 1, 512, 513, 1 << 20, 1<<20 + 1, 5 << 20, 12 << 20, 1 << 30} {
			p, err := a.Malloc(sz, 1)
			require.NoError(t, err, sz)
			require.NoError(t, a.checkInvariants())
			ps = append(ps, uint64(p))
		}
		for _, p := range ps {
			require.NoError(t, a.Free(ptr(p)))
			require.NoError(t, a.checkInvariants())
		}
		require.NoError(t, a.EmptyCache())
		require.NoError(t, a.checkInvariants())
		st := a.Stats()
		require.Zero(t, st["reserved_bytes.all.current"], "vmm=%v", vmm)
		require.Zero(t, d.Mapped())
		require.Empty(t, d.violations)
		require.NoError(t, a.Close())
	}
}
