package allocator

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/memscale/memscale/device"
	"github.com/memscale/memscale/device/sim"
)

// simTestDevice is device/sim with call counters, and with SynchronizeEvent
// and Synchronize that fail instead of blocking on a busy stream, so that a
// single-threaded property test never hangs (the model knows the semantics).
type simTestDevice struct {
	*sim.Device
	nCreate, nMap, nAlloc atomic.Int64
	nBusy                 atomic.Int64 // streams set busy by SetStreamBusy
	busy                  sync.Map     // device.Stream -> struct{}
}

func newSimTestDevice(t testing.TB, capacity, gran uint64) *simTestDevice {
	t.Helper()
	d, err := sim.New(sim.Config{Capacity: capacity, Granularity: gran})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return &simTestDevice{Device: d}
}

// testStreams returns, by number 0 to n, stream handles of d: 0 and the
// default streams 1 and 2 themselves, and from 3 on streams made by d's
// CreateStream when it has one (the sim, which refuses made-up handles), the
// number itself otherwise (the fake device).
func testStreams(t testing.TB, d any, n int) []device.Stream {
	t.Helper()
	out := make([]device.Stream, n+1)
	mk, _ := d.(interface{ CreateStream() (device.Stream, error) })
	for i := range out {
		out[i] = device.Stream(i)
		if i > 2 && mk != nil {
			s, err := mk.CreateStream()
			require.NoError(t, err)
			out[i] = s
		}
	}
	return out
}

func (d *simTestDevice) CreatePhysical(size uint64) (device.Handle, error) {
	d.nCreate.Add(1)
	return d.Device.CreatePhysical(size)
}

func (d *simTestDevice) Map(addr device.Ptr, size uint64, h device.Handle) error {
	d.nMap.Add(1)
	return d.Device.Map(addr, size, h)
}

func (d *simTestDevice) MapRange(addr device.Ptr, each uint64, hs []device.Handle) error {
	d.nMap.Add(int64(len(hs)))
	return d.Device.MapRange(addr, each, hs)
}

func (d *simTestDevice) Alloc(size uint64) (device.Ptr, error) {
	d.nAlloc.Add(1)
	return d.Device.Alloc(size)
}

func (d *simTestDevice) SynchronizeEvent(e device.Event) error {
	ok, err := d.QueryEvent(e)
	if err != nil {
		return err
	}
	if !ok {
		return errWouldBlock
	}
	return nil
}

// SetStreamBusy is the sim's, counting the busy streams for Synchronize.
func (d *simTestDevice) SetStreamBusy(s device.Stream, busy bool) {
	if busy {
		if _, had := d.busy.LoadOrStore(s, struct{}{}); !had {
			d.nBusy.Add(1)
		}
	} else if _, had := d.busy.LoadAndDelete(s); had {
		d.nBusy.Add(-1)
	}
	d.Device.SetStreamBusy(s, busy)
}

// Synchronize fails instead of blocking while a stream is busy.
func (d *simTestDevice) Synchronize() error {
	if d.nBusy.Load() > 0 {
		return errWouldBlock
	}
	return d.Device.Synchronize()
}

func (d *simTestDevice) counts() int {
	return int(d.nCreate.Load() + d.nMap.Load() + d.nAlloc.Load())
}

func (d *simTestDevice) problems() []string { return nil }

func TestPropertySim(t *testing.T) {
	const capacity = 8 << 30
	for _, vmm := range []bool{true, false} {
		name := "vmm"
		if !vmm {
			name = "fallback"
		}
		t.Run(name, func(t *testing.T) {
			for seed := uint64(11); seed <= 13; seed++ {
				runProperty(t, propConfig{
					seed: seed, steps: 2000, capacity: capacity, maxSize: 1 << 30, streams: 3, vmm: vmm,
					newDev: func() propDevice { return newSimTestDevice(t, capacity, 0) },
				})
			}
		})
	}
}

// bytesAt views n bytes of simulated device memory at p.
func bytesAt(p device.Ptr, n uint64) []byte {
	addr := uintptr(p)
	return unsafe.Slice(*(**byte)(unsafe.Pointer(&addr)), n)
}

// TestSimMemoryIsReal writes a pattern into allocations of several sizes on
// device/sim, reads it back, and checks that memory unmapped by EmptyCache
// faults when touched.
func TestSimMemoryIsReal(t *testing.T) {
	for _, vmm := range []bool{true, false} {
		d := newSimTestDevice(t, 1<<30, 0)
		a, err := New(Config{Device: d, DisableVMM: !vmm})
		require.NoError(t, err)
		sizes := []uint64{1, 512, 4096, 1 << 20, 3<<20 + 17, 24 << 20}
		ptrs := make([]device.Ptr, len(sizes))
		for i, n := range sizes {
			ptrs[i], err = a.Malloc(n, 1)
			require.NoError(t, err)
			buf := bytesAt(ptrs[i], n)
			for j := range buf {
				buf[j] = byte(i*31 + j*7)
			}
		}
		for i, n := range sizes {
			buf := bytesAt(ptrs[i], n)
			for j := range buf {
				if buf[j] != byte(i*31+j*7) {
					t.Fatalf("vmm=%v: allocation %d (%d bytes) byte %d reads %d", vmm, i, n, j, buf[j])
				}
			}
		}
		last := ptrs[len(ptrs)-1]
		for _, p := range ptrs {
			require.NoError(t, a.Free(p))
		}
		require.NoError(t, a.EmptyCache())
		require.Zero(t, d.Mapped())
		require.True(t, faults(func() { bytesAt(last, 1)[0] = 1 }), "vmm=%v: freed and unmapped memory must fault", vmm)
		require.NoError(t, a.Close())
	}
}

// faults reports whether fn faulted on a memory access.
func faults(fn func()) (faulted bool) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if r := recover(); r != nil {
			faulted = true
		}
	}()
	fn()
	return false
}

// TestSimSyncWaitsForBusyStream checks the real waiting path: with the
// plain sim, EmptyCache blocks on a busy stream's pending free until another
// goroutine sets the stream idle, then releases the memory.
func TestSimSyncWaitsForBusyStream(t *testing.T) {
	d, err := sim.New(sim.Config{Capacity: 1 << 30})
	require.NoError(t, err)
	defer func() { _ = d.Close() }()
	a, err := New(Config{Device: d})
	require.NoError(t, err)
	p, err := a.Malloc(8<<20, 1)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, 2))
	d.SetStreamBusy(2, true)
	require.NoError(t, a.Free(p))
	require.Equal(t, int64(1), a.Stats()["pending_frees"])

	go func() {
		time.Sleep(50 * time.Millisecond)
		d.SetStreamBusy(2, false)
	}()
	start := time.Now()
	require.NoError(t, a.EmptyCache())
	require.GreaterOrEqual(t, time.Since(start), 40*time.Millisecond, "EmptyCache must have waited")
	st := a.Stats()
	require.Zero(t, st["pending_frees"])
	require.Zero(t, st["active_bytes.all.current"])
	require.Zero(t, d.Mapped())
	require.NoError(t, a.Close())
}

// TestSimRefusesMadeUpStream: on the sim, as on a driver, RecordStream with a
// handle that is not a stream of the device is refused, the allocation
// unchanged; a stream from CreateStream is accepted.
func TestSimRefusesMadeUpStream(t *testing.T) {
	d := newSimTestDevice(t, 1<<30, 0)
	a, err := New(Config{Device: d})
	require.NoError(t, err)
	defer func() { _ = a.Close() }()
	p, err := a.Malloc(1<<20, 0)
	require.NoError(t, err)
	err = a.RecordStream(p, 0xdeadbeef)
	require.ErrorIs(t, err, sim.ErrInvalid)
	require.ErrorContains(t, err, "stream 0xdeadbeef is not a stream of this device")
	s, err := d.CreateStream()
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, a.Free(p))
}
