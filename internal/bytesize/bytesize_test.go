package bytesize

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFormat(t *testing.T) {
	tests := []struct {
		n        uint64
		decimals int
		want     string
	}{
		{0, 1, "0 B"},
		{1023, 2, "1023 B"},
		{1024, 1, "1.0 KiB"},
		{1536, 2, "1.50 KiB"},
		{2 << 20, 1, "2.0 MiB"},
		{16 << 30, 2, "16.00 GiB"},
		{3 << 40, 1, "3.0 TiB"},
		{5 << 50, 1, "5.0 PiB"},
		{1 << 62, 0, "4096 PiB"},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, Format(tc.n, tc.decimals), "%d", tc.n)
	}
}
