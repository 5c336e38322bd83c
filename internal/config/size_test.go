package config

import (
	"errors"
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
	}{
		{"0", 0},
		{"1", 1},
		{"1073741824", 1 << 30},
		{"512B", 512},
		{"512 b", 512},
		{"1KB", 1000},
		{"1kb", 1000},
		{"1KiB", 1024},
		{"1kib", 1024},
		{"2MB", 2e6},
		{"2MiB", 2 << 20},
		{"12GiB", 12 << 30},
		{"12 GiB", 12 << 30},
		{"  12GiB  ", 12 << 30},
		{"1.5GiB", 3 << 29},
		{"1.5GB", 1_500_000_000},
		{"0.5KiB", 512},
		{"1.1KiB", 1126}, // 1126.4 rounded down
		{"3TB", 3e12},
		{"3TiB", 3 << 40},
		{"0.000000001GB", 1},
		{"0.0000000001GB", 0},
		{"007MiB", 7 << 20},
		{"18446744073709551615", math.MaxUint64},
		{"16777215.999999TiB", 18446744073708452104},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSize(tt.in)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseSizeErrors(t *testing.T) {
	tests := []struct {
		in, wantMsg string
	}{
		{"", "empty"},
		{"   ", "empty"},
		{"banana", "does not start with a digit"},
		{"-1", "negative"},
		{"-1GiB", "negative"},
		{"+1", "does not start with a digit"},
		{".5GiB", "does not start with a digit"},
		{"1.GiB", "no digits after the decimal point"},
		{"1.5", "fraction of a byte"},
		{"1.5B", "fraction of a byte"},
		{"12G", `unknown unit "G"`},
		{"12 gigabytes", `unknown unit "gigabytes"`},
		{"1e9", `unknown unit "e9"`},
		{"1,000", `unknown unit ",000"`},
		{"12GiB!", `unknown unit "GiB!"`},
		{"1 2", `unknown unit "2"`},
		{"75%", "percentage"},
		{"18446744073709551616", "more than"},
		{"16777216TiB", "more than"},
		{"99999999999999999999999999999999999999999999999999999999999999999", "longer than"},
		{"NaN", "does not start with a digit"},
		{"inf", "does not start with a digit"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			_, err := ParseSize(tt.in)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrSyntax)
			assert.Contains(t, err.Error(), tt.wantMsg)
		})
	}
}

func TestParseSizeOrPercent(t *testing.T) {
	tests := []struct {
		in   string
		want Size
	}{
		{"75%", Size{Percent: 75}},
		{" 75 % ", Size{Percent: 75}},
		{"12.5%", Size{Percent: 12.5}},
		{"100%", Size{Percent: 100}},
		{"0.001%", Size{Percent: 0.001}},
		{"12GiB", Size{Bytes: 12 << 30}},
		{"0", Size{}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSizeOrPercent(tt.in)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseSizeOrPercentErrors(t *testing.T) {
	tests := []struct {
		in, wantMsg string
	}{
		{"0%", "outside"},
		{"0.0%", "outside"},
		{"100.01%", "outside"},
		{"150%", "outside"},
		{"-5%", "negative"},
		{"%", "empty number"},
		{"75GiB%", "not a plain percentage"},
		{"75%%", `"75%%" is not a plain percentage`},
		{"abc%", "does not start with a digit"},
		{"1e2%", "not a plain percentage"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			_, err := ParseSizeOrPercent(tt.in)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrSyntax)
			assert.Contains(t, err.Error(), tt.wantMsg)
		})
	}
}

func TestSizeResolve(t *testing.T) {
	tests := []struct {
		name  string
		size  Size
		total uint64
		want  uint64
	}{
		{"bytes ignore total", Size{Bytes: 5}, 100, 5},
		{"zero", Size{}, 100, 0},
		{"75% of 16GiB", Size{Percent: 75}, 16 << 30, 12 << 30},
		{"100%", Size{Percent: 100}, 12345, 12345},
		{"rounds down", Size{Percent: 50}, 3, 1},
		{"33.3% exact decimal", Size{Percent: 33.3}, 1000, 333},
		{"0.1% of 1000", Size{Percent: 0.1}, 1000, 1},
		{"huge total", Size{Percent: 50}, math.MaxUint64, math.MaxUint64 / 2},
		{"tiny", Size{Percent: 1}, 99, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.size.Resolve(tt.total))
		})
	}
}

func TestSizeString(t *testing.T) {
	assert.Equal(t, "75%", Size{Percent: 75}.String())
	assert.Equal(t, "12.5%", Size{Percent: 12.5}.String())
	assert.Equal(t, "1024", Size{Bytes: 1024}.String())
	assert.True(t, Size{}.IsZero())
	assert.False(t, Size{Percent: 1}.IsZero())
	assert.True(t, Size{Percent: 1}.IsPercent())
}

// FuzzParseSize checks that ParseSize never panics, that what it accepts
// round-trips through the plain byte-count form, and that ParseSizeOrPercent
// agrees with it on absolute sizes.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"0", "12GiB", "1.5GB", "75%", "512 b", "-1", "1e9", "16777216TiB",
		"0.000000001GB", "18446744073709551615", "1.", ".5", "%", "12.5%", "100.000001%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("ParseSize(%q): error %v does not wrap ErrSyntax", s, err)
			}
		} else {
			back, err := ParseSize(strconv.FormatUint(n, 10))
			if err != nil || back != n {
				t.Fatalf("ParseSize(%q) = %d does not round-trip: %d, %v", s, n, back, err)
			}
		}
		sz, perr := ParseSizeOrPercent(s)
		if perr != nil {
			if !errors.Is(perr, ErrSyntax) {
				t.Fatalf("ParseSizeOrPercent(%q): error %v does not wrap ErrSyntax", s, perr)
			}
			return
		}
		if sz.IsPercent() {
			if sz.Percent <= 0 || sz.Percent > 100 || math.IsNaN(sz.Percent) {
				t.Fatalf("ParseSizeOrPercent(%q) = %v%%: outside (0, 100]", s, sz.Percent)
			}
			const total = 80 << 30
			if r := sz.Resolve(total); r > total {
				t.Fatalf("Resolve(%q) = %d > total", s, r)
			}
			return
		}
		if err != nil || sz.Bytes != n {
			t.Fatalf("ParseSizeOrPercent(%q) = %+v disagrees with ParseSize = %d, %v", s, sz, n, err)
		}
	})
}
