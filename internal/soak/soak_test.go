package soak

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOps(t *testing.T) {
	t.Setenv(EnvOps, "")
	n, err := Ops(7, 0.5)
	require.NoError(t, err)
	require.Equal(t, int64(7), n)
	require.False(t, Long())
	for v, want := range map[string]int64{"100000000": 50000000, "1e8": 50000000, "1": 1} {
		t.Setenv(EnvOps, v)
		n, err := Ops(7, 0.5)
		require.NoError(t, err, v)
		require.Equal(t, want, n, v)
		require.True(t, Long())
	}
	for _, v := range []string{"0", "-5", "abc", "1.5", "1e300", "NaN"} {
		t.Setenv(EnvOps, v)
		_, err := Ops(7, 0.5)
		require.ErrorContains(t, err, EnvOps, v)
	}
}
