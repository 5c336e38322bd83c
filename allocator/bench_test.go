package allocator

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/memscale/memscale/device"
	"github.com/memscale/memscale/device/sim"
)

func newBenchAllocator(b *testing.B, slack float64) *Allocator {
	b.Helper()
	d, err := sim.New(sim.Config{Capacity: 4 << 30})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Close() })
	a, err := New(Config{Device: d, CacheSlack: slack})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Close() })
	return a
}

// BenchmarkMallocFree measures a cached malloc+free pair of one size on one
// stream: the hot path once the cache is warm.
func BenchmarkMallocFree(b *testing.B) {
	for _, size := range []uint64{512, 64 << 10, 1 << 20, 16 << 20, 256 << 20} {
		b.Run(sizeName(size), func(b *testing.B) {
			a := newBenchAllocator(b, 0)
			p, err := a.Malloc(size, 1)
			if err != nil {
				b.Fatal(err)
			}
			if err := a.Free(p); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p, err := a.Malloc(size, 1)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Free(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMixed measures a steady state of 256 live blocks of random sizes
// (512 B to 64 MiB, log-uniform) on two streams, replacing one per iteration:
// the tree path (best fit, split, coalesce) as well as the quick cache.
func BenchmarkMixed(b *testing.B) {
	for _, c := range []struct {
		name  string
		slack float64
	}{{"slack=0", 0}, {"slack=0.1", 0.1}, {"no-remap", -1}} {
		b.Run(c.name, func(b *testing.B) { benchMixed(b, c.slack) })
	}
}

func benchMixed(b *testing.B, slack float64) {
	a := newBenchAllocator(b, slack)
	r := rand.New(rand.NewPCG(1, 2))
	const live = 256
	sizes := make([]uint64, 4096)
	for i := range sizes {
		sizes[i] = logUniform(r, 64<<20)
	}
	ptrs := make([]device.Ptr, live)
	for i := range ptrs {
		p, err := a.Malloc(sizes[i], device.Stream(1+i%2))
		if err != nil {
			b.Fatal(err)
		}
		ptrs[i] = p
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		j := i % live
		if err := a.Free(ptrs[j]); err != nil {
			b.Fatal(err)
		}
		p, err := a.Malloc(sizes[i%len(sizes)], device.Stream(1+j%2))
		if err != nil {
			b.Fatal(err)
		}
		ptrs[j] = p
	}
	b.StopTimer()
	st := a.Stats()
	b.ReportMetric(float64(st["num_remap"])/float64(b.N), "remaps/op")
	b.ReportMetric(float64(st["num_map"])/float64(b.N), "maps/op")
	b.ReportMetric(float64(st["reserved_bytes.all.peak"])/float64(st["allocated_bytes.all.peak"]), "peak-reserved/allocated")
}

// BenchmarkAllocated measures the atomic read.
func BenchmarkAllocated(b *testing.B) {
	a := newBenchAllocator(b, 0)
	var s uint64
	for i := 0; i < b.N; i++ {
		s += a.Allocated()
	}
	_ = s
}

func sizeName(n uint64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
