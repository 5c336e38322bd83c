package sweep

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/evict"
)

func TestParseRatios(t *testing.T) {
	tests := []struct {
		in      string
		want    []float64
		wantErr string
	}{
		{in: "0.5", want: []float64{0.5}},
		{in: "1", want: []float64{1}},
		{in: "0.3, 0.1,0.2", want: []float64{0.1, 0.2, 0.3}},
		{in: "0.2,0.2,0.1", want: []float64{0.1, 0.2}},
		{in: "0.2..0.5", want: []float64{0.2, 0.3, 0.4, 0.5}},
		{in: "0.1..0.9", want: []float64{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}},
		{in: "0.5..1/0.25", want: []float64{0.5, 0.75, 1}},
		{in: "0.2..0.3/0.04", want: []float64{0.2, 0.24, 0.28}},
		{in: "0.4..0.4", want: []float64{0.4}},
		{in: "0.9,0.1..0.2", want: []float64{0.1, 0.2, 0.9}},
		{in: "", wantErr: "empty ratio list"},
		{in: "  ", wantErr: "empty ratio list"},
		{in: "0", wantErr: `ratio "0" out of range: must be in (0, 1]`},
		{in: "-0.1", wantErr: `ratio "-0.1" out of range`},
		{in: "1.1", wantErr: `ratio "1.1" out of range`},
		{in: "abc", wantErr: `ratio "abc" is not a number`},
		{in: "0.1,x", wantErr: `ratio "x" is not a number`},
		{in: "NaN", wantErr: `ratio "NaN" out of range`},
		{in: "inf", wantErr: `ratio "inf" out of range`},
		{in: "0.1,,0.2", wantErr: `empty item in ratio list "0.1,,0.2"`},
		{in: "0.1,", wantErr: "empty item"},
		{in: "0.5..0.2", wantErr: `ratio range "0.5..0.2": end 0.2 is below start 0.5`},
		{in: "0.1..0.5/0", wantErr: `ratio range "0.1..0.5/0": step "0" is not a positive number`},
		{in: "0.1..0.5/x", wantErr: `step "x" is not a positive number`},
		{in: "0.1..2", wantErr: `ratio range "0.1..2": ratio "2" out of range`},
		{in: "0..0.5", wantErr: `ratio "0" out of range`},
		{in: "0.1..0.9/0.00001", wantErr: "too many"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseRatios(tc.in)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	assert.Equal(t, []float64{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}, DefaultRatios())
	d := DefaultRatios()
	d[0] = 7
	assert.Equal(t, 0.1, DefaultRatios()[0], "DefaultRatios returns a copy")
}

func TestParseHeuristics(t *testing.T) {
	all := append(evict.Heuristics(), evict.Auto)
	tests := []struct {
		in      string
		want    []evict.Heuristic
		wantErr string
	}{
		{in: "dtr", want: []evict.Heuristic{evict.DTR}},
		{in: "DTR_EQ, msps", want: []evict.Heuristic{evict.DTREq, evict.MSPS}},
		{in: "default", want: []evict.Heuristic{evict.Default.Resolve()}},
		{in: "msps,dtr,msps", want: []evict.Heuristic{evict.MSPS, evict.DTR}},
		{in: "all", want: all},
		{in: "ALL,dtr", want: all},
		{in: "", wantErr: "empty heuristic list"},
		{in: "dtr,", wantErr: `empty item in heuristic list "dtr,"`},
		{in: "frobnicate", wantErr: `unknown heuristic "frobnicate"`},
		{in: "dtr,bogus", wantErr: `unknown heuristic "bogus"`},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseHeuristics(tc.in)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := ParseHeuristics("nope")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "or all", "the error lists 'all' as accepted")
	for _, h := range all {
		assert.NotEqual(t, evict.Default, h, "all never contains the unresolved default")
	}
}
