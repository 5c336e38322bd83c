//go:build linux

package sim

import (
	"fmt"
	"math"
	"os"
	"syscall"
	"time"

	"github.com/memscale/memscale/device"
)

// streamBase is the first handle CreateStream hands out; handles are spaced
// like pointers to distinct objects, never 0, 1 or 2.
const streamBase device.Stream = 0x5e0000

// The default streams, valid on every device as on a CUDA driver: the legacy
// default stream (0 or CU_STREAM_LEGACY) and the per-thread default stream
// (CU_STREAM_PER_THREAD).
const (
	streamLegacy    device.Stream = 1
	streamPerThread device.Stream = 2
)

// CreateStream makes a stream of this device, which CheckStream accepts
// until DestroyStream: the sim's counterpart of cuStreamCreate, for callers
// (tests, the C ABI's memscale_sim_stream_create) that need a stream other
// than the default ones. Handles are never reused. RecordEvent, the copies
// and SetStreamBusy take any handle, so that Go callers of the allocator may
// use streams as labels; CheckStream is where a handle is validated (the
// allocator's RecordStream and the C ABI's malloc and free ask it).
func (d *Device) CreateStream() (device.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fmt.Errorf("sim: CreateStream: %w", ErrClosed)
	}
	if d.nextStream == 0 {
		d.nextStream = streamBase
	}
	s := d.nextStream
	d.nextStream += 0x40
	d.made[s] = true
	return s, nil
}

// DestroyStream destroys a stream made by CreateStream; later uses of its
// handle are refused. A busy stream is set idle first.
func (d *Device) DestroyStream(s device.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("sim: DestroyStream: %w", ErrClosed)
	}
	if !d.made[s] {
		return fmt.Errorf("sim: DestroyStream(%#x): not a stream from CreateStream, or already destroyed: %w", uintptr(s), ErrInvalid)
	}
	delete(d.made, s)
	if st := d.streams[s]; st != nil {
		delete(d.streams, s)
		if st.busy {
			d.cond.Broadcast()
		}
	}
	return nil
}

// checkStreamLocked reports an error naming s and what is accepted when s is
// neither a default stream nor one from CreateStream. d.mu is held.
func (d *Device) checkStreamLocked(op string, s device.Stream) error {
	if s == 0 || s == streamLegacy || s == streamPerThread || d.made[s] {
		return nil
	}
	return fmt.Errorf("sim: %s: stream %#x is not a stream of this device (accepted: 0, 1 = CU_STREAM_LEGACY, "+
		"2 = CU_STREAM_PER_THREAD, and streams made by CreateStream / memscale_sim_stream_create and not destroyed): %w",
		op, uintptr(s), ErrInvalid)
}

// SetStreamBusy marks stream s as running work (busy) or idle. An event
// recorded on a busy stream stays incomplete, and a copy ordered on it waits,
// until the stream is set idle again. Streams start idle. After Close it does
// nothing.
func (d *Device) SetStreamBusy(s device.Stream, busy bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	st := d.streams[s]
	if st == nil {
		st = &stream{}
		d.streams[s] = st
	}
	switch {
	case busy && !st.busy:
		st.busy = true
		st.epoch++
	case !busy && st.busy:
		st.busy = false
		d.cond.Broadcast()
	}
}

// StreamBusy reports whether s is marked busy.
func (d *Device) StreamBusy(s device.Stream) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	st := d.streams[s]
	return st != nil && st.busy
}

// doneLocked reports whether the work captured by e has completed.
func (d *Device) doneLocked(e *event) bool {
	if !e.recorded {
		return true
	}
	st := d.streams[e.stream]
	return st == nil || !st.busy || st.epoch != e.epoch
}

// CreateEvent creates an event; an event never recorded counts as complete.
func (d *Device) CreateEvent() (device.Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fmt.Errorf("sim: CreateEvent: %w", ErrClosed)
	}
	d.nextEvent++
	d.events[d.nextEvent] = &event{}
	return d.nextEvent, nil
}

// RecordEvent captures the work on s so far: the event completes at once if s
// is idle, otherwise when s is next set idle.
func (d *Device) RecordEvent(e device.Event, s device.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("sim: RecordEvent: %w", ErrClosed)
	}
	ev, ok := d.events[e]
	if !ok {
		return fmt.Errorf("sim: RecordEvent(%d): unknown or destroyed event: %w", e, ErrInvalid)
	}
	// On an idle stream there is nothing pending: the event is complete, as
	// one never recorded.
	*ev = event{stream: s}
	if st := d.streams[s]; st != nil && st.busy {
		ev.recorded, ev.epoch = true, st.epoch
	}
	return nil
}

// QueryEvent reports whether the work captured by e has completed.
func (d *Device) QueryEvent(e device.Event) (bool, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return false, fmt.Errorf("sim: QueryEvent: %w", ErrClosed)
	}
	ev, ok := d.events[e]
	if !ok {
		return false, fmt.Errorf("sim: QueryEvent(%d): unknown or destroyed event: %w", e, ErrInvalid)
	}
	return d.doneLocked(ev), nil
}

// SynchronizeEvent blocks until the work captured by e has completed.
func (d *Device) SynchronizeEvent(e device.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		if d.closed {
			return fmt.Errorf("sim: SynchronizeEvent: %w", ErrClosed)
		}
		ev, ok := d.events[e]
		if !ok {
			return fmt.Errorf("sim: SynchronizeEvent(%d): unknown or destroyed event: %w", e, ErrInvalid)
		}
		if d.doneLocked(ev) {
			return nil
		}
		d.cond.Wait()
	}
}

// DestroyEvent frees an event.
func (d *Device) DestroyEvent(e device.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("sim: DestroyEvent: %w", ErrClosed)
	}
	if _, ok := d.events[e]; !ok {
		return fmt.Errorf("sim: DestroyEvent(%d): unknown or already destroyed event: %w", e, ErrInvalid)
	}
	delete(d.events, e)
	d.cond.Broadcast() // wake SynchronizeEvent waiters on it
	return nil
}

// Synchronize blocks until no stream is busy.
func (d *Device) Synchronize() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		if d.closed {
			return fmt.Errorf("sim: Synchronize: %w", ErrClosed)
		}
		busy := false
		for _, st := range d.streams {
			busy = busy || st.busy
		}
		if !busy {
			return nil
		}
		d.cond.Wait()
	}
}

// waitStream blocks until stream s is idle.
func (d *Device) waitStream(op string, s device.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		if d.closed {
			return fmt.Errorf("sim: %s: %w", op, ErrClosed)
		}
		if st := d.streams[s]; st == nil || !st.busy {
			return nil
		}
		d.cond.Wait()
	}
}

// AllocHost allocates size bytes of host memory (an anonymous mapping; the
// simulation has no page locking to do).
func (d *Device) AllocHost(size uint64) (uintptr, error) {
	if size == 0 {
		return 0, fmt.Errorf("sim: AllocHost: size is 0: %w", ErrInvalid)
	}
	page := uint64(os.Getpagesize())
	if size > math.MaxUint64-page {
		return 0, fmt.Errorf("sim: AllocHost(%d): size too large: %w", size, ErrInvalid)
	}
	rounded := (size + page - 1) / page * page
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fmt.Errorf("sim: AllocHost: %w", ErrClosed)
	}
	p, err := mmap(0, rounded, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS, -1, 0)
	if err != nil {
		return 0, fmt.Errorf("sim: AllocHost(%d): mmap: %w", size, err)
	}
	d.hostAllocs[p] = rounded
	return p, nil
}

// FreeHost frees memory obtained from AllocHost.
func (d *Device) FreeHost(p uintptr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("sim: FreeHost: %w", ErrClosed)
	}
	n, ok := d.hostAllocs[p]
	if !ok {
		return fmt.Errorf("sim: FreeHost(%#x): not a live pointer from AllocHost: %w", p, ErrInvalid)
	}
	if err := munmap(p, n); err != nil {
		return fmt.Errorf("sim: FreeHost(%#x): munmap: %w", p, err)
	}
	delete(d.hostAllocs, p)
	return nil
}

// CopyToHost copies n bytes from device address src to host address dst after
// the work on stream s, and returns when the copy is done (including the
// modeled transfer time). The device range must be mapped.
func (d *Device) CopyToHost(dst uintptr, src device.Ptr, n uint64, s device.Stream) error {
	return d.copyBytes("CopyToHost", dst, uintptr(src), src, n, s)
}

// CopyToDevice copies n bytes from host address src to device address dst
// after the work on stream s, and returns when the copy is done (including the
// modeled transfer time). The device range must be mapped.
func (d *Device) CopyToDevice(dst device.Ptr, src uintptr, n uint64, s device.Stream) error {
	return d.copyBytes("CopyToDevice", uintptr(dst), src, dst, n, s)
}

// copyBytes moves n bytes from src to dst; dev is the device side, checked to
// be mapped.
func (d *Device) copyBytes(op string, dst, src uintptr, dev device.Ptr, n uint64, s device.Stream) error {
	if n == 0 {
		return nil
	}
	if dst == 0 || src == 0 {
		return fmt.Errorf("sim: %s(%#x <- %#x, %d): null address: %w", op, dst, src, n, ErrInvalid)
	}
	if err := d.waitStream(op, s); err != nil {
		return err
	}
	start := time.Now()
	if err := d.copyMapped(op, dst, src, dev, n); err != nil {
		return err
	}
	d.copiedBytes.Add(n)
	if bw := d.cfg.CopyBandwidth; bw > 0 {
		modeled := time.Duration(float64(n) / bw * float64(time.Second))
		d.modeledNs.Add(int64(modeled))
		if !d.cfg.ModelOnly {
			if rest := modeled - time.Since(start); rest > 0 {
				time.Sleep(rest)
			}
		}
	}
	return nil
}

// copyMapped checks that [dev, dev+n) is mapped and copies, holding the read
// lock so nothing is unmapped meanwhile.
func (d *Device) copyMapped(op string, dst, src uintptr, dev device.Ptr, n uint64) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return fmt.Errorf("sim: %s: %w", op, ErrClosed)
	}
	if uint64(dev)+n < uint64(dev) {
		return fmt.Errorf("sim: %s: device range %#x + %d overflows: %w", op, dev, n, ErrInvalid)
	}
	g := device.Ptr(d.cfg.Granularity)
	end := dev + device.Ptr(n)
	for p := dev - dev%g; p < end; p += g {
		if _, ok := d.granules[p]; !ok {
			lo := max(p, dev)
			return fmt.Errorf("sim: %s: device range [%#x, %#x) is not mapped at %#x (illegal address): %w", op, dev, end, lo, ErrInvalid)
		}
	}
	copy(hostBytes(dst, n), hostBytes(src, n))
	return nil
}
