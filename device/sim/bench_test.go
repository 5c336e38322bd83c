//go:build linux

package sim

import (
	"testing"

	"github.com/memscale/memscale/device"
)

// BenchmarkMapUnmap measures one Map + Unmap of a 2 MiB chunk.
func BenchmarkMapUnmap(b *testing.B) {
	d, err := New(Config{Capacity: 64 * gran})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	p, err := d.ReserveAddress(gran)
	if err != nil {
		b.Fatal(err)
	}
	h, err := d.CreatePhysical(gran)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := d.Map(p, gran, h); err != nil {
			b.Fatal(err)
		}
		if err := d.Unmap(p, gran); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreateRelease measures one CreatePhysical + ReleasePhysical of a
// 2 MiB chunk in a file that holds another live chunk (so release punches a
// hole instead of truncating).
func BenchmarkCreateRelease(b *testing.B) {
	d, err := New(Config{Capacity: 64 * gran})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	if _, err := d.CreatePhysical(gran); err != nil {
		b.Fatal(err)
	}
	var hs [2]device.Handle
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range hs {
			if hs[j], err = d.CreatePhysical(gran); err != nil {
				b.Fatal(err)
			}
		}
		for j := range hs {
			if err := d.ReleasePhysical(hs[j]); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkAllocFree measures the Alloc/Free fallback (reserve, create, map
// and back) for 1 MiB.
func BenchmarkAllocFree(b *testing.B) {
	d, err := New(Config{Capacity: 64 * gran})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p, err := d.Alloc(1 << 20)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Free(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCopyToHost measures a 2 MiB device-to-host copy (touched pages).
func BenchmarkCopyToHost(b *testing.B) {
	d, err := New(Config{Capacity: 64 * gran})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	p, err := d.ReserveAddress(gran)
	if err != nil {
		b.Fatal(err)
	}
	h, err := d.CreatePhysical(gran)
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Map(p, gran, h); err != nil {
		b.Fatal(err)
	}
	host, err := d.AllocHost(gran)
	if err != nil {
		b.Fatal(err)
	}
	if err := d.CopyToDevice(p, host, gran, 0); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(gran))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := d.CopyToHost(host, p, gran, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEventRecordQuery measures RecordEvent + QueryEvent on an idle stream.
func BenchmarkEventRecordQuery(b *testing.B) {
	d, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	e, err := d.CreateEvent()
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := d.RecordEvent(e, 1); err != nil {
			b.Fatal(err)
		}
		if _, err := d.QueryEvent(e); err != nil {
			b.Fatal(err)
		}
	}
}
