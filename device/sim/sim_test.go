//go:build linux

package sim

import (
	"errors"
	"math"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/device"
)

const gran = DefaultGranularity

// newDev returns a small simulated device closed at the end of the test.
func newDev(t *testing.T, cfg Config) *Device {
	t.Helper()
	if cfg.Capacity == 0 {
		cfg.Capacity = 64 * gran
	}
	d, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	return d
}

var sink byte

// faults reports whether reading the byte at p faults; SetPanicOnFault turns
// the SIGSEGV into a recoverable panic.
func faults(p uintptr) (faulted bool) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if r := recover(); r != nil {
			faulted = true
		}
	}()
	sink = hostBytes(p, 1)[0]
	return false
}

// mapped reserves size bytes, creates a chunk and maps it; returns both.
func mapped(t *testing.T, d *Device, size uint64) (device.Ptr, device.Handle) {
	t.Helper()
	p, err := d.ReserveAddress(size)
	require.NoError(t, err)
	h, err := d.CreatePhysical(size)
	require.NoError(t, err)
	require.NoError(t, d.Map(p, size, h))
	return p, h
}

func TestNewValidatesConfig(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "zero config gets defaults", cfg: Config{}},
		{name: "explicit", cfg: Config{Capacity: 1 << 30, Granularity: 64 << 10, CopyBandwidth: 1e9, FailMapAt: 3, FailAllocAt: 2}},
		{name: "granularity not page multiple", cfg: Config{Granularity: 1000}, wantErr: "Granularity 1000 is not a multiple of the page size"},
		{name: "negative bandwidth", cfg: Config{CopyBandwidth: -1}, wantErr: "CopyBandwidth -1"},
		{name: "NaN bandwidth", cfg: Config{CopyBandwidth: math.NaN()}, wantErr: "CopyBandwidth NaN"},
		{name: "Inf bandwidth", cfg: Config{CopyBandwidth: math.Inf(1)}, wantErr: "CopyBandwidth +Inf"},
		{name: "negative FailMapAt", cfg: Config{FailMapAt: -1}, wantErr: "FailMapAt -1"},
		{name: "negative FailAllocAt", cfg: Config{FailAllocAt: -2}, wantErr: "FailAllocAt -2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(tc.cfg)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.ErrorIs(t, err, ErrInvalid)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			defer func() { require.NoError(t, d.Close()) }()
			info := d.Info()
			assert.Equal(t, "sim", info.Backend)
			assert.Equal(t, Name, info.Name)
			assert.True(t, info.VMM)
			want := tc.cfg
			if want.Capacity == 0 {
				want.Capacity = DefaultCapacity
			}
			if want.Granularity == 0 {
				want.Granularity = DefaultGranularity
			}
			assert.Equal(t, want, d.Config())
			assert.Equal(t, want.Capacity, info.TotalMemory)
			assert.Equal(t, want.Granularity, info.Granularity)
		})
	}
}

func TestReserveAddress(t *testing.T) {
	d := newDev(t, Config{})
	tests := []struct {
		name    string
		size    uint64
		wantErr string
	}{
		{name: "zero", size: 0, wantErr: "size is 0"},
		{name: "not a multiple", size: gran + 4096, wantErr: "not a multiple of the granularity"},
		{name: "one granule", size: gran},
		{name: "many granules, more than capacity", size: 1024 * gran},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := d.ReserveAddress(tc.size)
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrInvalid)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Zero(t, uint64(p)%gran, "reservation aligned to the granularity")
			assert.True(t, faults(uintptr(p)), "reserved memory is inaccessible")
			assert.True(t, faults(uintptr(p)+uintptr(tc.size)-1))
			assert.Zero(t, d.Mapped(), "reserving takes no physical memory")
			require.NoError(t, d.FreeAddress(p, tc.size))
		})
	}
}

func TestFreeAddress(t *testing.T) {
	d := newDev(t, Config{})
	p, err := d.ReserveAddress(4 * gran)
	require.NoError(t, err)
	h, err := d.CreatePhysical(gran)
	require.NoError(t, err)
	require.NoError(t, d.Map(p+device.Ptr(gran), gran, h))

	tests := []struct {
		name    string
		base    device.Ptr
		size    uint64
		before  func()
		wantErr string
	}{
		{name: "not a base", base: p + device.Ptr(gran), size: 3 * gran, wantErr: "not the base of a reserved range"},
		{name: "wrong size", base: p, size: 2 * gran, wantErr: "reserved with size"},
		{name: "still mapped", base: p, size: 4 * gran, wantErr: "still mapped"},
		{name: "ok after unmap", base: p, size: 4 * gran, before: func() { require.NoError(t, d.Unmap(p+device.Ptr(gran), gran)) }},
		{name: "twice", base: p, size: 4 * gran, wantErr: "not the base of a reserved range"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.before != nil {
				tc.before()
			}
			err := d.FreeAddress(tc.base, tc.size)
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrInvalid)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
		})
	}
	require.NoError(t, d.ReleasePhysical(h))
}

func TestCreatePhysicalAndCapacity(t *testing.T) {
	d := newDev(t, Config{Capacity: 8 * gran})
	tests := []struct {
		name     string
		size     uint64
		wantErr  string
		wantOOM  bool
		wantFree uint64 // MemInfo free afterwards
	}{
		{name: "zero", size: 0, wantErr: "size is 0", wantFree: 8 * gran},
		{name: "not a multiple", size: 3 << 20, wantErr: "not a multiple of the granularity 2097152", wantFree: 8 * gran},
		{name: "one granule", size: gran, wantFree: 7 * gran},
		{name: "four granules", size: 4 * gran, wantFree: 3 * gran},
		{name: "more than free", size: 4 * gran, wantOOM: true, wantFree: 3 * gran},
		{name: "exactly the rest", size: 3 * gran, wantFree: 0},
		{name: "full", size: gran, wantOOM: true, wantFree: 0},
	}
	var handles []device.Handle
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := d.CreatePhysical(tc.size)
			switch {
			case tc.wantOOM:
				var oom *device.OutOfMemoryError
				require.ErrorAs(t, err, &oom)
				assert.ErrorIs(t, err, device.ErrOutOfMemory)
				assert.Equal(t, "CreatePhysical", oom.Op)
				assert.Equal(t, tc.size, oom.Requested)
				assert.Equal(t, tc.wantFree, oom.Free)
			case tc.wantErr != "":
				require.ErrorIs(t, err, ErrInvalid)
				assert.Contains(t, err.Error(), tc.wantErr)
			default:
				require.NoError(t, err)
				assert.NotZero(t, h)
				handles = append(handles, h)
			}
			free, total, err := d.MemInfo()
			require.NoError(t, err)
			assert.Equal(t, 8*gran, total)
			assert.Equal(t, tc.wantFree, free)
			assert.Equal(t, 8*gran-tc.wantFree, d.Mapped())
		})
	}
	for _, h := range handles {
		require.NoError(t, d.ReleasePhysical(h))
	}
	assert.Zero(t, d.Mapped())
	free, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, 8*gran, free)
}

func TestReleasePhysical(t *testing.T) {
	d := newDev(t, Config{})
	p, h := mapped(t, d, gran)
	tests := []struct {
		name    string
		h       device.Handle
		before  func()
		wantErr string
	}{
		{name: "unknown", h: 999, wantErr: "unknown or already released handle"},
		{name: "still mapped", h: h, wantErr: "still mapped at 1 place"},
		{name: "ok", h: h, before: func() { require.NoError(t, d.Unmap(p, gran)) }},
		{name: "twice", h: h, wantErr: "unknown or already released handle"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.before != nil {
				tc.before()
			}
			err := d.ReleasePhysical(tc.h)
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrInvalid)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
		})
	}
	assert.Zero(t, d.Mapped())
	require.NoError(t, d.FreeAddress(p, gran))
}

func TestMap(t *testing.T) {
	d := newDev(t, Config{})
	base, err := d.ReserveAddress(4 * gran)
	require.NoError(t, err)
	h1, err := d.CreatePhysical(gran)
	require.NoError(t, err)
	h2, err := d.CreatePhysical(2 * gran)
	require.NoError(t, err)
	at := func(i uint64) device.Ptr { return base + device.Ptr(i*gran) }

	tests := []struct {
		name    string
		addr    device.Ptr
		size    uint64
		h       device.Handle
		wantErr string
	}{
		{name: "zero size", addr: at(0), size: 0, h: h1, wantErr: "size is 0"},
		{name: "size not a multiple", addr: at(0), size: 4096, h: h1, wantErr: "not a multiple of the granularity"},
		{name: "unaligned address", addr: at(0) + 4096, size: gran, h: h1, wantErr: "not aligned to the granularity"},
		{name: "unknown handle", addr: at(0), size: gran, h: 12345, wantErr: "unknown or released handle"},
		{name: "size differs from handle", addr: at(0), size: 2 * gran, h: h1, wantErr: "the handle holds 2097152 bytes"},
		{name: "outside any reservation", addr: at(8), size: gran, h: h1, wantErr: "not inside a reserved range"},
		{name: "runs past the reservation", addr: at(3), size: 2 * gran, h: h2, wantErr: "not inside a reserved range"},
		{name: "ok", addr: at(1), size: 2 * gran, h: h2},
		{name: "overlaps", addr: at(2), size: gran, h: h1, wantErr: "is already mapped"},
		{name: "second mapping of the same handle elsewhere is allowed", addr: at(0), size: gran, h: h1},
		{name: "same handle again in a taken place", addr: at(0), size: gran, h: h1, wantErr: "is already mapped"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := d.Map(tc.addr, tc.size, tc.h)
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrInvalid)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			b := hostBytes(uintptr(tc.addr), tc.size)
			b[0], b[len(b)-1] = 0xAB, 0xCD
			assert.Equal(t, byte(0xAB), hostBytes(uintptr(tc.addr), 1)[0])
			assert.False(t, faults(uintptr(tc.addr)+uintptr(tc.size)-1))
		})
	}
	assert.True(t, faults(uintptr(at(3))), "granule 3 was never mapped")
	require.NoError(t, d.Unmap(at(0), 3*gran), "unmapping several whole mappings at once")
	require.NoError(t, d.ReleasePhysical(h1))
	require.NoError(t, d.ReleasePhysical(h2))
	require.NoError(t, d.FreeAddress(base, 4*gran))
}

func TestSharedPhysicalAndPersistence(t *testing.T) {
	d := newDev(t, Config{})
	a, err := d.ReserveAddress(gran)
	require.NoError(t, err)
	b, err := d.ReserveAddress(gran)
	require.NoError(t, err)
	h, err := d.CreatePhysical(gran)
	require.NoError(t, err)
	require.NoError(t, d.Map(a, gran, h))
	require.NoError(t, d.Map(b, gran, h))
	hostBytes(uintptr(a), gran)[100] = 42
	assert.Equal(t, byte(42), hostBytes(uintptr(b), gran)[100], "two mappings of one chunk share pages")

	require.NoError(t, d.Unmap(a, gran))
	require.NoError(t, d.Unmap(b, gran))
	require.NoError(t, d.Map(a, gran, h))
	assert.Equal(t, byte(42), hostBytes(uintptr(a), gran)[100], "physical memory keeps its contents across unmap/map")
	require.NoError(t, d.Unmap(a, gran))
	require.NoError(t, d.ReleasePhysical(h))

	// A chunk created after a release does not see old contents.
	h2, err := d.CreatePhysical(gran)
	require.NoError(t, err)
	require.NoError(t, d.Map(a, gran, h2))
	assert.Equal(t, byte(0), hostBytes(uintptr(a), gran)[100])
	require.NoError(t, d.Unmap(a, gran))
	require.NoError(t, d.ReleasePhysical(h2))
}

func TestUnmap(t *testing.T) {
	d := newDev(t, Config{})
	base, err := d.ReserveAddress(4 * gran)
	require.NoError(t, err)
	h, err := d.CreatePhysical(2 * gran)
	require.NoError(t, err)
	require.NoError(t, d.Map(base, 2*gran, h))
	at := func(i uint64) device.Ptr { return base + device.Ptr(i*gran) }

	tests := []struct {
		name    string
		addr    device.Ptr
		size    uint64
		wantErr string
	}{
		{name: "zero", addr: at(0), size: 0, wantErr: "size is 0"},
		{name: "not a multiple", addr: at(0), size: 100, wantErr: "not a multiple"},
		{name: "not mapped", addr: at(2), size: gran, wantErr: "is not mapped"},
		{name: "middle of a mapping", addr: at(1), size: gran, wantErr: "in the middle of a mapping"},
		{name: "part of a mapping", addr: at(0), size: gran, wantErr: "extends past the range"},
		{name: "past the mapping", addr: at(0), size: 3 * gran, wantErr: "is not mapped"},
		{name: "ok", addr: at(0), size: 2 * gran},
		{name: "twice", addr: at(0), size: 2 * gran, wantErr: "is not mapped"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := d.Unmap(tc.addr, tc.size)
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrInvalid)
				assert.Contains(t, err.Error(), tc.wantErr)
				_, stillMapped := d.mappings[at(0)]
				assert.Equal(t, stillMapped, !faults(uintptr(at(0))), "a failed Unmap changes nothing")
				return
			}
			require.NoError(t, err)
		})
	}
	require.NoError(t, d.ReleasePhysical(h))
	require.NoError(t, d.FreeAddress(base, 4*gran))
}

// TestTouchAfterUnmapFaults is the property the allocator's tests rely on:
// reading or writing device memory that was unmapped (freed, evicted) faults
// instead of silently returning stale data.
func TestTouchAfterUnmapFaults(t *testing.T) {
	d := newDev(t, Config{})
	p, h := mapped(t, d, 2*gran)
	hostBytes(uintptr(p), 2*gran)[gran+7] = 9
	require.False(t, faults(uintptr(p)+uintptr(gran)+7))
	require.NoError(t, d.Unmap(p, 2*gran))
	for _, off := range []uintptr{0, 7, uintptr(gran), uintptr(2*gran) - 1} {
		assert.True(t, faults(uintptr(p)+off), "offset %d after Unmap", off)
	}
	require.NoError(t, d.ReleasePhysical(h))

	a, err := d.Alloc(100)
	require.NoError(t, err)
	require.False(t, faults(uintptr(a)+99))
	require.NoError(t, d.Free(a))
	// The freed range is gone entirely (munmap): touching it faults too.
	assert.True(t, faults(uintptr(a)))
}

func TestAllocFree(t *testing.T) {
	d := newDev(t, Config{Capacity: 4 * gran})
	tests := []struct {
		name       string
		size       uint64
		wantErr    string
		wantOOM    bool
		wantMapped uint64
	}{
		{name: "zero", size: 0, wantErr: "size is 0"},
		{name: "small rounds up to a granule", size: 1, wantMapped: gran},
		{name: "exact granules", size: 2 * gran, wantMapped: 3 * gran},
		{name: "too big", size: gran + 1, wantOOM: true, wantMapped: 3 * gran},
		{name: "huge", size: math.MaxUint64, wantOOM: true, wantMapped: 3 * gran},
		{name: "the rest", size: gran, wantMapped: 4 * gran},
	}
	var ptrs []device.Ptr
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := d.Alloc(tc.size)
			switch {
			case tc.wantOOM:
				var oom *device.OutOfMemoryError
				require.ErrorAs(t, err, &oom)
				assert.Equal(t, "Alloc", oom.Op)
				assert.Equal(t, tc.size, oom.Requested)
			case tc.wantErr != "":
				require.ErrorIs(t, err, ErrInvalid)
				assert.Contains(t, err.Error(), tc.wantErr)
			default:
				require.NoError(t, err)
				b := hostBytes(uintptr(p), tc.size)
				b[0], b[tc.size-1] = 1, 2
				ptrs = append(ptrs, p)
			}
			assert.Equal(t, tc.wantMapped, d.Mapped())
		})
	}
	freeTests := []struct {
		name    string
		p       device.Ptr
		wantErr string
	}{
		{name: "unknown", p: 0x1000, wantErr: "not a live pointer from Alloc"},
		{name: "interior pointer", p: ptrs[0] + 1, wantErr: "not a live pointer from Alloc"},
		{name: "ok", p: ptrs[0]},
		{name: "double free", p: ptrs[0], wantErr: "not a live pointer from Alloc"},
		{name: "ok 2", p: ptrs[1]},
		{name: "ok 3", p: ptrs[2]},
	}
	for _, tc := range freeTests {
		t.Run("Free "+tc.name, func(t *testing.T) {
			err := d.Free(tc.p)
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrInvalid)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
		})
	}
	assert.Zero(t, d.Mapped())
}

func TestFaultInjection(t *testing.T) {
	t.Run("FailMapAt", func(t *testing.T) {
		d := newDev(t, Config{FailMapAt: 2})
		base, err := d.ReserveAddress(3 * gran)
		require.NoError(t, err)
		var hs []device.Handle
		for i := 0; i < 3; i++ {
			h, err := d.CreatePhysical(gran)
			require.NoError(t, err)
			hs = append(hs, h)
		}
		want := []bool{false, true, false}
		for i, fail := range want {
			err := d.Map(base+device.Ptr(uint64(i)*gran), gran, hs[i])
			if fail {
				require.ErrorIs(t, err, ErrInjected, "map call %d", i+1)
				assert.Contains(t, err.Error(), "map call 2")
				assert.True(t, faults(uintptr(base)+uintptr(uint64(i)*gran)), "failed map maps nothing")
			} else {
				require.NoError(t, err, "map call %d", i+1)
			}
		}
		// Re-arm: the next Map fails.
		require.NoError(t, d.InjectFaults(1, 0))
		require.ErrorIs(t, d.Map(base+device.Ptr(gran), gran, hs[1]), ErrInjected)
		require.NoError(t, d.Map(base+device.Ptr(gran), gran, hs[1]))
		require.Error(t, d.InjectFaults(-1, 0))
	})
	t.Run("FailAllocAt counts CreatePhysical and Alloc", func(t *testing.T) {
		d := newDev(t, Config{FailAllocAt: 3})
		_, err := d.CreatePhysical(gran) // 1
		require.NoError(t, err)
		_, err = d.Alloc(10) // 2
		require.NoError(t, err)
		_, err = d.Alloc(10) // 3: fails
		require.ErrorIs(t, err, ErrInjected)
		require.ErrorIs(t, err, device.ErrOutOfMemory)
		var oom *device.OutOfMemoryError
		require.ErrorAs(t, err, &oom)
		assert.Equal(t, "Alloc", oom.Op)
		assert.Equal(t, 2*gran, d.Mapped(), "the failed call took nothing")
		_, err = d.CreatePhysical(gran) // 4
		require.NoError(t, err)

		require.NoError(t, d.InjectFaults(0, 1))
		_, err = d.CreatePhysical(gran)
		require.ErrorIs(t, err, ErrInjected)
		require.ErrorAs(t, err, &oom)
		assert.Equal(t, "CreatePhysical", oom.Op)
		_, err = d.CreatePhysical(gran)
		require.NoError(t, err)
	})
}

func TestEvents(t *testing.T) {
	const s1, s2 = device.Stream(1), device.Stream(2)
	type step struct {
		do       func(d *Device, e device.Event) error
		wantDone bool
	}
	record := func(s device.Stream) func(*Device, device.Event) error {
		return func(d *Device, e device.Event) error { return d.RecordEvent(e, s) }
	}
	busy := func(s device.Stream, b bool) func(*Device, device.Event) error {
		return func(d *Device, _ device.Event) error { d.SetStreamBusy(s, b); return nil }
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "never recorded is complete", steps: []step{{do: busy(s1, true), wantDone: true}}},
		{name: "idle stream completes at once", steps: []step{{do: record(s1), wantDone: true}}},
		{name: "busy stream holds it", steps: []step{
			{do: busy(s1, true), wantDone: true},
			{do: record(s1), wantDone: false},
			{do: busy(s2, false), wantDone: false},
			{do: busy(s1, false), wantDone: true},
		}},
		{name: "later busy period does not undo completion", steps: []step{
			{do: busy(s1, true), wantDone: true},
			{do: record(s1), wantDone: false},
			{do: busy(s1, false), wantDone: true},
			{do: busy(s1, true), wantDone: true},
		}},
		{name: "re-record on a busy stream", steps: []step{
			{do: record(s1), wantDone: true},
			{do: busy(s1, true), wantDone: true},
			{do: record(s1), wantDone: false},
			{do: record(s2), wantDone: true},
		}},
		{name: "other stream busy", steps: []step{
			{do: busy(s2, true), wantDone: true},
			{do: record(s1), wantDone: true},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDev(t, Config{})
			e, err := d.CreateEvent()
			require.NoError(t, err)
			for i, st := range tc.steps {
				require.NoError(t, st.do(d, e), "step %d", i)
				done, err := d.QueryEvent(e)
				require.NoError(t, err)
				assert.Equal(t, st.wantDone, done, "step %d", i)
			}
			d.SetStreamBusy(s1, false)
			d.SetStreamBusy(s2, false)
			require.NoError(t, d.SynchronizeEvent(e))
			require.NoError(t, d.DestroyEvent(e))
		})
	}
}

func TestEventErrors(t *testing.T) {
	d := newDev(t, Config{})
	e, err := d.CreateEvent()
	require.NoError(t, err)
	require.NoError(t, d.DestroyEvent(e))
	tests := []struct {
		name string
		call func() error
	}{
		{name: "RecordEvent", call: func() error { return d.RecordEvent(e, 0) }},
		{name: "QueryEvent", call: func() error { _, err := d.QueryEvent(e); return err }},
		{name: "SynchronizeEvent", call: func() error { return d.SynchronizeEvent(e) }},
		{name: "DestroyEvent", call: func() error { return d.DestroyEvent(e) }},
		{name: "unknown", call: func() error { return d.RecordEvent(777, 0) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), "unknown")
		})
	}
}

func TestSynchronizeWaitsForBusyStreams(t *testing.T) {
	d := newDev(t, Config{})
	e, err := d.CreateEvent()
	require.NoError(t, err)
	d.SetStreamBusy(5, true)
	require.True(t, d.StreamBusy(5))
	require.NoError(t, d.RecordEvent(e, 5))

	var wg sync.WaitGroup
	done := make(chan string, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		assert.NoError(t, d.SynchronizeEvent(e))
		done <- "event"
	}()
	go func() {
		defer wg.Done()
		assert.NoError(t, d.Synchronize())
		done <- "device"
	}()
	select {
	case w := <-done:
		t.Fatalf("%s synchronize returned while the stream was busy", w)
	case <-time.After(50 * time.Millisecond):
	}
	d.SetStreamBusy(5, false)
	wg.Wait()
	assert.Len(t, done, 2)
}

func TestCloseReleasesWaiters(t *testing.T) {
	d, err := New(Config{Capacity: 4 * gran})
	require.NoError(t, err)
	e, err := d.CreateEvent()
	require.NoError(t, err)
	d.SetStreamBusy(1, true)
	require.NoError(t, d.RecordEvent(e, 1))
	errc := make(chan error, 1)
	go func() { errc <- d.SynchronizeEvent(e) }()
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, d.Close())
	require.ErrorIs(t, <-errc, ErrClosed)
}

func TestHostMemory(t *testing.T) {
	d := newDev(t, Config{})
	tests := []struct {
		name    string
		size    uint64
		wantErr string
	}{
		{name: "zero", size: 0, wantErr: "size is 0"},
		{name: "too large", size: math.MaxUint64, wantErr: "size too large"},
		{name: "one byte", size: 1},
		{name: "odd size", size: 3*4096 + 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := d.AllocHost(tc.size)
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrInvalid)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			hostBytes(p, tc.size)[tc.size-1] = 7
			require.NoError(t, d.FreeHost(p))
			err = d.FreeHost(p)
			require.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), "not a live pointer from AllocHost")
		})
	}
}

func TestCopies(t *testing.T) {
	d := newDev(t, Config{})
	dev, h := mapped(t, d, 2*gran)
	host, err := d.AllocHost(2 * gran)
	require.NoError(t, err)
	src := hostBytes(host, 2*gran)
	for i := range src {
		src[i] = byte(i * 7)
	}
	require.NoError(t, d.CopyToDevice(dev, host, 2*gran, 0))
	assert.Equal(t, src, hostBytes(uintptr(dev), 2*gran))

	back := make([]byte, 1000)
	require.NoError(t, d.CopyToHost(hostAddr(back), dev+device.Ptr(gran)-500, 1000, 3), "a copy across two granules")
	assert.Equal(t, src[gran-500:gran+500], back)
	assert.Equal(t, 2*gran+1000, d.CopiedBytes())
	assert.Zero(t, d.ModeledCopyTime(), "no bandwidth model")

	unmappedRes, err := d.ReserveAddress(gran)
	require.NoError(t, err)
	tests := []struct {
		name    string
		call    func() error
		wantErr string
	}{
		{name: "zero bytes is a no-op", call: func() error { return d.CopyToHost(0, 0, 0, 0) }},
		{name: "null host", call: func() error { return d.CopyToHost(0, dev, 1, 0) }, wantErr: "null address"},
		{name: "null device", call: func() error { return d.CopyToDevice(0, host, 1, 0) }, wantErr: "null address"},
		{name: "device range runs past the mapping", call: func() error { return d.CopyToHost(host, dev+device.Ptr(gran), 2*gran, 0) }, wantErr: "is not mapped at"},
		{name: "reserved but unmapped", call: func() error { return d.CopyToDevice(unmappedRes, host, 10, 0) }, wantErr: "illegal address"},
		{name: "not device memory at all", call: func() error { return d.CopyToDevice(device.Ptr(host), host, 10, 0) }, wantErr: "illegal address"},
		{name: "overflow", call: func() error { return d.CopyToHost(host, device.Ptr(math.MaxUint64-10), 100, 0) }, wantErr: "overflows"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrInvalid)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
		})
	}
	require.NoError(t, d.FreeAddress(unmappedRes, gran))
	require.NoError(t, d.Unmap(dev, 2*gran))
	require.NoError(t, d.ReleasePhysical(h))
	require.NoError(t, d.FreeHost(host))
}

// escaped keeps the buffers given to hostAddr on the heap: a stack-allocated
// buffer could move when the stack grows, leaving a stale address.
var escaped atomic.Pointer[[]byte]

// hostAddr is the address of a Go byte slice's first element.
func hostAddr(b []byte) uintptr {
	escaped.Store(&b)
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}

func TestCopyBandwidthModel(t *testing.T) {
	tests := []struct {
		name      string
		bw        float64
		modelOnly bool
	}{
		{name: "sleeps", bw: 100e6, modelOnly: false},  // 3 MiB take ~31 ms
		{name: "model only", bw: 1e6, modelOnly: true}, // 3 MiB would take ~3 s
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bw := tc.bw
			d := newDev(t, Config{CopyBandwidth: bw, ModelOnly: tc.modelOnly})
			dev, _ := mapped(t, d, gran)
			buf := make([]byte, gran)
			start := time.Now()
			require.NoError(t, d.CopyToHost(hostAddr(buf), dev, gran, 0))
			require.NoError(t, d.CopyToDevice(dev, hostAddr(buf), gran/2, 0))
			elapsed := time.Since(start)
			total := float64(gran + gran/2)
			want := time.Duration(total / bw * float64(time.Second))
			assert.InDelta(t, float64(want), float64(d.ModeledCopyTime()), float64(time.Microsecond))
			if tc.modelOnly {
				assert.Less(t, elapsed, want, "model-only copies do not sleep")
			} else {
				assert.GreaterOrEqual(t, elapsed, want, "copies take the modeled time")
			}
		})
	}
}

func TestCopyWaitsForBusyStream(t *testing.T) {
	d := newDev(t, Config{})
	dev, _ := mapped(t, d, gran)
	buf := make([]byte, 16)
	d.SetStreamBusy(9, true)
	errc := make(chan error, 1)
	go func() { errc <- d.CopyToHost(hostAddr(buf), dev, 16, 9) }()
	select {
	case <-errc:
		t.Fatal("copy finished while its stream was busy")
	case <-time.After(30 * time.Millisecond):
	}
	require.NoError(t, d.CopyToHost(hostAddr(buf), dev, 16, 8), "other streams are not held up")
	d.SetStreamBusy(9, false)
	require.NoError(t, <-errc)
}

func TestClosed(t *testing.T) {
	d, err := New(Config{Capacity: 4 * gran})
	require.NoError(t, err)
	p, h := mapped(t, d, gran)
	a, err := d.Alloc(1)
	require.NoError(t, err)
	hp, err := d.AllocHost(1)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	require.NoError(t, d.Close(), "Close is idempotent")
	assert.True(t, faults(uintptr(p)), "Close unmaps everything")
	assert.True(t, faults(uintptr(a)))
	assert.True(t, faults(hp))

	calls := map[string]func() error{
		"MemInfo":          func() error { _, _, err := d.MemInfo(); return err },
		"ReserveAddress":   func() error { _, err := d.ReserveAddress(gran); return err },
		"FreeAddress":      func() error { return d.FreeAddress(p, gran) },
		"CreatePhysical":   func() error { _, err := d.CreatePhysical(gran); return err },
		"ReleasePhysical":  func() error { return d.ReleasePhysical(h) },
		"Map":              func() error { return d.Map(p, gran, h) },
		"Unmap":            func() error { return d.Unmap(p, gran) },
		"Alloc":            func() error { _, err := d.Alloc(1); return err },
		"Free":             func() error { return d.Free(a) },
		"CreateEvent":      func() error { _, err := d.CreateEvent(); return err },
		"RecordEvent":      func() error { return d.RecordEvent(1, 0) },
		"QueryEvent":       func() error { _, err := d.QueryEvent(1); return err },
		"SynchronizeEvent": func() error { return d.SynchronizeEvent(1) },
		"DestroyEvent":     func() error { return d.DestroyEvent(1) },
		"Synchronize":      func() error { return d.Synchronize() },
		"AllocHost":        func() error { _, err := d.AllocHost(1); return err },
		"FreeHost":         func() error { return d.FreeHost(hp) },
		"CopyToHost":       func() error { return d.CopyToHost(hp, p, 1, 0) },
		"CopyToDevice":     func() error { return d.CopyToDevice(p, hp, 1, 0) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			assert.ErrorIs(t, call(), ErrClosed)
		})
	}
	d.SetStreamBusy(1, true) // no-op, no panic
	assert.Zero(t, d.Mapped())
}

// TestFileDescriptorsBounded checks that a Device holds one descriptor however
// many chunks exist, and gives file space back.
func TestFileDescriptorsBounded(t *testing.T) {
	countFDs := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		return len(ents)
	}
	d := newDev(t, Config{Capacity: 512 * gran})
	before := countFDs()
	var hs []device.Handle
	for i := 0; i < 300; i++ {
		h, err := d.CreatePhysical(gran)
		require.NoError(t, err)
		hs = append(hs, h)
	}
	assert.Equal(t, before, countFDs())
	// Release every other chunk, then the rest: the free list coalesces and the
	// file shrinks back to nothing.
	for i := 0; i < len(hs); i += 2 {
		require.NoError(t, d.ReleasePhysical(hs[i]))
	}
	for i := 1; i < len(hs); i += 2 {
		require.NoError(t, d.ReleasePhysical(hs[i]))
	}
	d.mu.RLock()
	assert.Zero(t, d.fileSz)
	assert.Empty(t, d.free)
	d.mu.RUnlock()
}

func TestFreeSpanReuse(t *testing.T) {
	d := newDev(t, Config{})
	a, err := d.CreatePhysical(2 * gran)
	require.NoError(t, err)
	b, err := d.CreatePhysical(gran)
	require.NoError(t, err)
	require.NoError(t, d.ReleasePhysical(a))
	c, err := d.CreatePhysical(gran) // reuses the start of a's span
	require.NoError(t, err)
	d.mu.RLock()
	assert.Equal(t, int64(0), d.handles[c].off)
	assert.Equal(t, int64(3*gran), d.fileSz)
	assert.Equal(t, []span{{off: int64(gran), size: gran}}, d.free)
	d.mu.RUnlock()
	require.NoError(t, d.ReleasePhysical(b))
	require.NoError(t, d.ReleasePhysical(c))
	d.mu.RLock()
	assert.Zero(t, d.fileSz)
	d.mu.RUnlock()
}

func TestConcurrentUse(t *testing.T) {
	d := newDev(t, Config{Capacity: 64 * gran})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := 0; i < 50; i++ {
				p, err := d.ReserveAddress(2 * gran)
				if err != nil {
					errs <- err
					return
				}
				h, err := d.CreatePhysical(gran)
				if err != nil {
					errs <- err
					return
				}
				err = errors.Join(
					d.Map(p+device.Ptr(gran), gran, h),
					d.CopyToDevice(p+device.Ptr(gran), hostAddr(buf), 4096, device.Stream(w)),
					d.CopyToHost(hostAddr(buf), p+device.Ptr(gran), 4096, device.Stream(w)),
					d.Unmap(p+device.Ptr(gran), gran),
					d.ReleasePhysical(h),
					d.FreeAddress(p, 2*gran),
				)
				if err != nil {
					errs <- err
					return
				}
				e, err := d.CreateEvent()
				if err == nil {
					err = errors.Join(d.RecordEvent(e, device.Stream(w)), d.SynchronizeEvent(e), d.DestroyEvent(e))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Zero(t, d.Mapped())
}

// TestCheckStreamRefusesMadeUpHandles: as a driver refuses a made-up stream
// handle (CUDA_ERROR_INVALID_HANDLE), CheckStream accepts only the default
// streams and streams from CreateStream not yet destroyed.
func TestCheckStreamRefusesMadeUpHandles(t *testing.T) {
	d := newDev(t, Config{})
	for _, s := range []device.Stream{0, 1, 2} {
		require.NoError(t, d.CheckStream(s), "default stream %#x", uintptr(s))
	}
	err := d.CheckStream(0xdeadbeef)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "stream 0xdeadbeef is not a stream of this device")
	require.ErrorContains(t, err, "CreateStream")

	s, err := d.CreateStream()
	require.NoError(t, err)
	require.Greater(t, uintptr(s), uintptr(2), "a created stream is not a default one")
	require.NoError(t, d.CheckStream(s))
	s2, err := d.CreateStream()
	require.NoError(t, err)
	require.NotEqual(t, s, s2)

	require.NoError(t, d.DestroyStream(s))
	require.ErrorIs(t, d.CheckStream(s), ErrInvalid, "a destroyed stream is refused")
	require.ErrorIs(t, d.DestroyStream(s), ErrInvalid, "destroyed twice")
	require.ErrorIs(t, d.DestroyStream(0xdeadbeef), ErrInvalid)
	require.NoError(t, d.CheckStream(s2))

	require.NoError(t, d.Close())
	require.ErrorIs(t, d.CheckStream(0), ErrClosed)
	_, err = d.CreateStream()
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, d.DestroyStream(s2), ErrClosed)
}
