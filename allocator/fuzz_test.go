package allocator

import (
	"encoding/binary"
	"testing"
)

// byteSource turns fuzz input into decisions; it yields zeros once the
// input is used up.
type byteSource struct {
	data []byte
}

func (b *byteSource) next() uint64 {
	var buf [8]byte
	n := copy(buf[:], b.data)
	b.data = b.data[n:]
	return binary.LittleEndian.Uint64(buf[:])
}

func (b *byteSource) take() uint64 {
	if len(b.data) == 0 {
		return 0
	}
	v := uint64(b.data[0])
	b.data = b.data[1:]
	if len(b.data) > 0 {
		v |= uint64(b.data[0]) << 8
		b.data = b.data[1:]
	}
	return v
}

func (b *byteSource) IntN(n int) int          { return int(b.take() % uint64(n)) }
func (b *byteSource) Uint64N(n uint64) uint64 { return b.next() % n }
func (b *byteSource) Float64() float64        { return float64(b.take()) / 65536 }

// FuzzAllocator drives the reference-model property check from fuzz bytes:
// the first byte picks the configuration (VMM or not, granularity, cache
// slack), the rest picks operations, sizes and streams.
func FuzzAllocator(f *testing.F) {
	f.Add([]byte{0, 10, 0, 20, 0, 30, 0, 90, 0, 85, 0, 60, 0})
	f.Add([]byte{1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte{2, 0, 255, 0, 255, 50, 0, 92, 1, 80, 0, 95, 0, 96, 0, 0, 200, 0, 200})
	f.Add([]byte{7, 40, 250, 40, 250, 40, 250, 84, 0, 40, 250, 97, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		mode := data[0]
		src := &byteSource{data: data[1:]}
		vmm := mode&1 == 0
		gran := uint64(2 << 20)
		if mode&2 != 0 {
			gran = 64 << 10
		}
		slack := 0.0
		if mode&4 != 0 {
			slack = -1
		}
		const capacity = 1 << 30
		runProperty(t, propConfig{
			steps: 400, capacity: capacity, maxSize: 256 << 20, streams: 3, vmm: vmm, slack: slack,
			newDev: func() propDevice { return newFakeDevice(capacity, gran, vmm) },
			src:    src,
			done:   func() bool { return len(src.data) == 0 },
		})
	})
}
