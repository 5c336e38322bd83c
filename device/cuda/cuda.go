// Package cuda implements device.Device on the CUDA driver API.
//
// The driver is reached through dlopen("libcuda.so.1") and dlsym at run time:
// no CUDA header or library is needed to build, and a binary or c-shared
// library containing this package has no undefined symbols beyond libc/libdl,
// so it loads (even with immediate binding) on a machine without a driver.
// There every entry point returns an error wrapping device.ErrUnavailable; the
// package never exits or panics for lack of a driver.
//
// A Device uses the device's primary context (the one PyTorch uses). Each
// driver call is made with that context current on the calling thread, and the
// thread's previous current context is restored afterwards.
//
// Memory mapped by MapRange is accessible to the device and to every other
// device that cuDeviceCanAccessPeer says can access it (as PyTorch's
// expandable segments do once peer access is enabled), with one
// cuMemSetAccess per mapped range. If the driver refuses access for the peers
// it is set for the device alone from then on (Info.Peers becomes empty).
package cuda

/*
#cgo LDFLAGS: -ldl
#include "driver.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/memscale/memscale/device"
)

// Library is the shared object that is loaded.
const Library = "libcuda.so.1"

// ErrorOutOfMemory is CUDA_ERROR_OUT_OF_MEMORY.
const ErrorOutOfMemory = 2

// defaultGranularity is reported when the device has no VMM support.
const defaultGranularity = 2 << 20

// Error is a failed driver call.
type Error struct {
	// Call is the driver function that failed ("cuMemCreate").
	Call string
	// Code is the CUresult.
	Code int
	// Name is the CUresult's name ("CUDA_ERROR_OUT_OF_MEMORY") when the driver
	// could tell it, else "".
	Name string
	// Description is the driver's description of Code, when available.
	Description string
}

// Error formats the call, the CUresult name and number, and the description.
func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = "CUresult"
	}
	if e.Description != "" {
		return fmt.Sprintf("%s: %s (%d): %s", e.Call, name, e.Code, e.Description)
	}
	return fmt.Sprintf("%s: %s (%d)", e.Call, name, e.Code)
}

// resErr converts a wrapper outcome to an error (nil on success).
func resErr(r C.ms_res) *Error {
	if r.r == 0 {
		return nil
	}
	e := &Error{Call: C.GoString(r.call), Code: int(r.r)}
	if s := C.ms_error_name(r.r); s != nil {
		e.Name = C.GoString(s)
	}
	if s := C.ms_error_string(r.r); s != nil {
		e.Description = C.GoString(s)
	}
	return e
}

// driver is the process-wide state of the loaded library: it is loaded and
// initialized at most once (a dlopen'ed driver is never unloaded), so this is
// the one piece of package-level state, and it is written only inside once.
var driver struct {
	once sync.Once
	err  error
}

// load dlopens the driver, resolves its symbols and calls cuInit, once.
func load() error {
	driver.once.Do(func() {
		var buf [512]C.char
		if C.ms_load(&buf[0], C.size_t(len(buf))) != 0 {
			driver.err = fmt.Errorf("cuda: %s: %w", C.GoString(&buf[0]), device.ErrUnavailable)
			return
		}
		if err := resErr(C.ms_init()); err != nil {
			driver.err = fmt.Errorf("cuda: %w: %w", err, device.ErrUnavailable)
		}
	})
	return driver.err
}

// Available reports whether the CUDA driver can be loaded and initialized. The
// error wraps device.ErrUnavailable and says why not.
func Available() error { return load() }

// DriverVersion returns the driver's CUDA version (e.g. 12040 for 12.4).
func DriverVersion() (int, error) {
	if err := load(); err != nil {
		return 0, err
	}
	var v C.int
	if err := resErr(C.ms_driver_version(&v)); err != nil {
		return 0, fmt.Errorf("cuda: %w", err)
	}
	return int(v), nil
}

// DeviceCount returns the number of CUDA devices.
func DeviceCount() (int, error) {
	if err := load(); err != nil {
		return 0, err
	}
	var n C.int
	if err := resErr(C.ms_device_count(&n)); err != nil {
		return 0, fmt.Errorf("cuda: %w", err)
	}
	return int(n), nil
}

// Device is one CUDA device, used through its primary context. It is safe for
// concurrent use; it must not be used after Close.
type Device struct {
	ordinal int
	dev     C.CUdevice
	ctx     C.CUcontext
	info    device.Info
	closed  atomic.Bool
	// peers are the ordinals that can access this device's memory; cleared
	// (once) if the driver refuses to grant them access.
	peersMu sync.Mutex
	peers   []C.int
}

// Open retains the primary context of device ordinal and returns the device.
// Without a driver or without devices the error wraps device.ErrUnavailable.
func Open(ordinal int) (*Device, error) {
	if ordinal < 0 {
		return nil, fmt.Errorf("cuda: Open: device ordinal %d is negative", ordinal)
	}
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("cuda: Open(%d): the driver reports no CUDA devices: %w", ordinal, device.ErrUnavailable)
	}
	if ordinal >= n {
		return nil, fmt.Errorf("cuda: Open: device ordinal %d out of range: %d device(s) present (0..%d)", ordinal, n, n-1)
	}
	d := &Device{ordinal: ordinal}
	if err := resErr(C.ms_device_get(C.int(ordinal), &d.dev)); err != nil {
		return nil, fmt.Errorf("cuda: Open(%d): %w", ordinal, err)
	}
	if err := resErr(C.ms_retain(d.dev, &d.ctx)); err != nil {
		return nil, fmt.Errorf("cuda: Open(%d): %w", ordinal, err)
	}
	var (
		name  [256]C.char
		total C.size_t
		vmm   C.int
		gran  C.size_t
	)
	if err := resErr(C.ms_device_props(d.ctx, d.dev, C.int(ordinal), &name[0], C.int(len(name)), &total, &vmm, &gran)); err != nil {
		C.ms_release(d.dev)
		return nil, fmt.Errorf("cuda: Open(%d): %w", ordinal, err)
	}
	d.info = device.Info{
		Backend:     "cuda",
		Ordinal:     ordinal,
		Name:        C.GoString(&name[0]),
		TotalMemory: uint64(total),
		Granularity: uint64(gran),
		VMM:         vmm != 0 && gran != 0,
	}
	if d.info.Granularity == 0 {
		d.info.Granularity = defaultGranularity
	}
	for j := 0; j < n; j++ {
		var other C.CUdevice
		var can C.int
		if j == ordinal || resErr(C.ms_device_get(C.int(j), &other)) != nil ||
			resErr(C.ms_can_access_peer(other, d.dev, &can)) != nil || can == 0 {
			continue // best effort: a device that cannot be asked is no peer
		}
		d.peers = append(d.peers, C.int(j))
	}
	return d, nil
}

// check returns an error if d was closed.
func (d *Device) check(op string) error {
	if d.closed.Load() {
		return fmt.Errorf("cuda: %s on device %d: device closed", op, d.ordinal)
	}
	return nil
}

// wrap adds the operation and device to a driver error.
func (d *Device) wrap(op string, e *Error) error {
	if e == nil {
		return nil
	}
	return fmt.Errorf("cuda: %s on device %d: %w", op, d.ordinal, e)
}

// vmm returns an error when the VMM calls cannot be used.
func (d *Device) vmm(op string) error {
	if err := d.check(op); err != nil {
		return err
	}
	if !d.info.VMM {
		return fmt.Errorf("cuda: %s on device %d: virtual memory management is not supported by this device or driver", op, d.ordinal)
	}
	return nil
}

// oom turns CUDA_ERROR_OUT_OF_MEMORY from an allocation into a
// *device.OutOfMemoryError (wrapping the driver error too).
func (d *Device) oom(op string, size uint64, e *Error) error {
	if e == nil {
		return nil
	}
	if e.Code != ErrorOutOfMemory {
		return d.wrap(op, e)
	}
	var free, total C.size_t
	C.ms_mem_info(d.ctx, &free, &total) // best effort; 0 if it fails
	return fmt.Errorf("cuda: device %d: %w: %w", d.ordinal, &device.OutOfMemoryError{Op: op, Requested: size, Free: uint64(free)}, e)
}

// Info describes the device.
func (d *Device) Info() device.Info {
	info := d.info
	d.peersMu.Lock()
	defer d.peersMu.Unlock()
	for _, p := range d.peers {
		info.Peers = append(info.Peers, int(p))
	}
	return info
}

// MemInfo returns the free and total device memory (cuMemGetInfo).
func (d *Device) MemInfo() (free, total uint64, err error) {
	if err := d.check("MemInfo"); err != nil {
		return 0, 0, err
	}
	var f, t C.size_t
	if err := d.wrap("MemInfo", resErr(C.ms_mem_info(d.ctx, &f, &t))); err != nil {
		return 0, 0, err
	}
	return uint64(f), uint64(t), nil
}

// checkSize validates a VMM size.
func (d *Device) checkSize(op string, size uint64) error {
	if size == 0 || size%d.info.Granularity != 0 {
		return fmt.Errorf("cuda: %s on device %d: size %d is not a positive multiple of the granularity %d", op, d.ordinal, size, d.info.Granularity)
	}
	return nil
}

// ReserveAddress reserves virtual address space aligned to the granularity
// (cuMemAddressReserve).
func (d *Device) ReserveAddress(size uint64) (device.Ptr, error) {
	if err := d.vmm("ReserveAddress"); err != nil {
		return 0, err
	}
	if err := d.checkSize("ReserveAddress", size); err != nil {
		return 0, err
	}
	var p C.CUdeviceptr
	if err := d.wrap("ReserveAddress", resErr(C.ms_reserve(d.ctx, C.size_t(size), C.size_t(d.info.Granularity), &p))); err != nil {
		return 0, err
	}
	return device.Ptr(p), nil
}

// FreeAddress frees a reservation (cuMemAddressFree).
func (d *Device) FreeAddress(base device.Ptr, size uint64) error {
	if err := d.vmm("FreeAddress"); err != nil {
		return err
	}
	return d.wrap("FreeAddress", resErr(C.ms_address_free(d.ctx, C.CUdeviceptr(base), C.size_t(size))))
}

// CreatePhysical creates pinned device memory on this device (cuMemCreate).
func (d *Device) CreatePhysical(size uint64) (device.Handle, error) {
	if err := d.vmm("CreatePhysical"); err != nil {
		return 0, err
	}
	if err := d.checkSize("CreatePhysical", size); err != nil {
		return 0, err
	}
	var h C.CUmemGenericAllocationHandle
	if err := d.oom("CreatePhysical", size, resErr(C.ms_create(d.ctx, C.int(d.ordinal), C.size_t(size), &h))); err != nil {
		return 0, err
	}
	return device.Handle(h), nil
}

// ReleasePhysical releases a handle (cuMemRelease).
func (d *Device) ReleasePhysical(h device.Handle) error {
	if err := d.vmm("ReleasePhysical"); err != nil {
		return err
	}
	return d.wrap("ReleasePhysical", resErr(C.ms_release_physical(d.ctx, C.CUmemGenericAllocationHandle(h))))
}

// Map maps h at addr and grants access (MapRange with one handle).
func (d *Device) Map(addr device.Ptr, size uint64, h device.Handle) error {
	return d.MapRange(addr, size, []device.Handle{h})
}

// MapRange maps the handles hs (each of size each) one after another from
// addr (cuMemMap per handle) and grants read-write access to the whole range
// once (one cuMemSetAccess for the device and its peers). On failure nothing
// stays mapped.
func (d *Device) MapRange(addr device.Ptr, each uint64, hs []device.Handle) error {
	if err := d.vmm("Map"); err != nil {
		return err
	}
	if err := d.checkSize("Map", each); err != nil {
		return err
	}
	if len(hs) == 0 {
		return nil
	}
	d.peersMu.Lock()
	defer d.peersMu.Unlock()
	var peers *C.int
	if len(d.peers) > 0 {
		peers = &d.peers[0]
	}
	var dropped C.int
	// hs holds no Go pointers; uintptr and CUmemGenericAllocationHandle are both 64 bits.
	err := d.wrap("Map", resErr(C.ms_map_range(d.ctx, C.int(d.ordinal), C.CUdeviceptr(addr), C.size_t(each),
		(*C.CUmemGenericAllocationHandle)(unsafe.Pointer(&hs[0])), C.size_t(len(hs)), peers, C.int(len(d.peers)), &dropped)))
	if dropped != 0 {
		d.peers = nil
	}
	return err
}

// Unmap unmaps [addr, addr+size) (cuMemUnmap).
func (d *Device) Unmap(addr device.Ptr, size uint64) error {
	if err := d.vmm("Unmap"); err != nil {
		return err
	}
	return d.wrap("Unmap", resErr(C.ms_unmap(d.ctx, C.CUdeviceptr(addr), C.size_t(size))))
}

// Alloc allocates device memory with cuMemAlloc.
func (d *Device) Alloc(size uint64) (device.Ptr, error) {
	if err := d.check("Alloc"); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, fmt.Errorf("cuda: Alloc on device %d: size is 0", d.ordinal)
	}
	var p C.CUdeviceptr
	if err := d.oom("Alloc", size, resErr(C.ms_alloc(d.ctx, C.size_t(size), &p))); err != nil {
		return 0, err
	}
	return device.Ptr(p), nil
}

// Free frees memory from Alloc (cuMemFree).
func (d *Device) Free(p device.Ptr) error {
	if err := d.check("Free"); err != nil {
		return err
	}
	return d.wrap("Free", resErr(C.ms_free(d.ctx, C.CUdeviceptr(p))))
}

// CreateEvent creates an event without timing (cuEventCreate).
func (d *Device) CreateEvent() (device.Event, error) {
	if err := d.check("CreateEvent"); err != nil {
		return 0, err
	}
	var e C.uintptr_t
	if err := d.wrap("CreateEvent", resErr(C.ms_event_create(d.ctx, &e))); err != nil {
		return 0, err
	}
	return device.Event(e), nil
}

// CheckStream reports an error when s is a stream of another CUDA context
// (another device's, cuStreamGetCtx), on which this device's events cannot be
// recorded. 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are this device's.
func (d *Device) CheckStream(s device.Stream) error {
	if err := d.check("CheckStream"); err != nil {
		return err
	}
	var same C.int
	if err := d.wrap("CheckStream", resErr(C.ms_stream_ctx(d.ctx, C.uintptr_t(s), &same))); err != nil {
		return fmt.Errorf("%w: stream %#x is not a valid stream (destroyed, or not a CUDA stream)", err, uintptr(s))
	}
	if same == 0 {
		return fmt.Errorf("cuda: stream %#x belongs to another CUDA context, not device %d's primary context: "+
			"use a stream of device %d (record_stream across devices is not supported by memscale)", uintptr(s), d.ordinal, d.ordinal)
	}
	return nil
}

// RecordEvent records e on stream s (cuEventRecord).
func (d *Device) RecordEvent(e device.Event, s device.Stream) error {
	if err := d.check("RecordEvent"); err != nil {
		return err
	}
	return d.wrap("RecordEvent", resErr(C.ms_event_record(d.ctx, C.uintptr_t(e), C.uintptr_t(s))))
}

// QueryEvent reports whether e has completed (cuEventQuery).
func (d *Device) QueryEvent(e device.Event) (bool, error) {
	if err := d.check("QueryEvent"); err != nil {
		return false, err
	}
	var done C.int
	if err := d.wrap("QueryEvent", resErr(C.ms_event_query(d.ctx, C.uintptr_t(e), &done))); err != nil {
		return false, err
	}
	return done != 0, nil
}

// SynchronizeEvent waits for e (cuEventSynchronize).
func (d *Device) SynchronizeEvent(e device.Event) error {
	if err := d.check("SynchronizeEvent"); err != nil {
		return err
	}
	return d.wrap("SynchronizeEvent", resErr(C.ms_event_sync(d.ctx, C.uintptr_t(e))))
}

// DestroyEvent destroys e (cuEventDestroy).
func (d *Device) DestroyEvent(e device.Event) error {
	if err := d.check("DestroyEvent"); err != nil {
		return err
	}
	return d.wrap("DestroyEvent", resErr(C.ms_event_destroy(d.ctx, C.uintptr_t(e))))
}

// Synchronize waits for all work in the primary context (cuCtxSynchronize).
func (d *Device) Synchronize() error {
	if err := d.check("Synchronize"); err != nil {
		return err
	}
	return d.wrap("Synchronize", resErr(C.ms_synchronize(d.ctx)))
}

// AllocHost allocates page-locked host memory (cuMemAllocHost).
func (d *Device) AllocHost(size uint64) (uintptr, error) {
	if err := d.check("AllocHost"); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, fmt.Errorf("cuda: AllocHost on device %d: size is 0", d.ordinal)
	}
	var p C.uintptr_t
	if err := d.wrap("AllocHost", resErr(C.ms_alloc_host(d.ctx, C.size_t(size), &p))); err != nil {
		return 0, err
	}
	return uintptr(p), nil
}

// FreeHost frees memory from AllocHost (cuMemFreeHost).
func (d *Device) FreeHost(p uintptr) error {
	if err := d.check("FreeHost"); err != nil {
		return err
	}
	return d.wrap("FreeHost", resErr(C.ms_free_host(d.ctx, C.uintptr_t(p))))
}

// CopyToHost copies device memory to host memory on stream s and waits for
// the stream (cuMemcpyDtoHAsync + cuStreamSynchronize).
func (d *Device) CopyToHost(dst uintptr, src device.Ptr, n uint64, s device.Stream) error {
	if err := d.check("CopyToHost"); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	return d.wrap("CopyToHost", resErr(C.ms_copy_dtoh(d.ctx, C.uintptr_t(dst), C.CUdeviceptr(src), C.size_t(n), C.uintptr_t(s))))
}

// CopyToDevice copies host memory to device memory on stream s and waits for
// the stream (cuMemcpyHtoDAsync + cuStreamSynchronize).
func (d *Device) CopyToDevice(dst device.Ptr, src uintptr, n uint64, s device.Stream) error {
	if err := d.check("CopyToDevice"); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	return d.wrap("CopyToDevice", resErr(C.ms_copy_htod(d.ctx, C.CUdeviceptr(dst), C.uintptr_t(src), C.size_t(n), C.uintptr_t(s))))
}

// Close releases the primary context reference taken by Open. Memory still
// allocated through the device stays allocated (the context lives on while
// PyTorch holds it). Calling Close again does nothing.
func (d *Device) Close() error {
	if !d.closed.CompareAndSwap(false, true) {
		return nil
	}
	return d.wrap("Close", resErr(C.ms_release(d.dev)))
}

// Compile-time check that Device implements device.Device.
var _ device.Device = (*Device)(nil)

// currentContext returns the calling thread's current context (tests use it
// with runtime.LockOSThread to check that calls restore it).
func currentContext() (uintptr, error) {
	if err := load(); err != nil {
		return 0, err
	}
	var c C.uintptr_t
	if err := resErr(C.ms_ctx_get(&c)); err != nil {
		return 0, err
	}
	return uintptr(c), nil
}

// setCurrentContext makes ctx current on the calling thread (tests only).
func setCurrentContext(ctx uintptr) error {
	if err := load(); err != nil {
		return err
	}
	if err := resErr(C.ms_ctx_set(C.uintptr_t(ctx))); err != nil {
		return err
	}
	return nil
}

// createStream makes a non-blocking stream in d's context (tests).
func (d *Device) createStream() (device.Stream, error) {
	var s C.uintptr_t
	if err := d.wrap("createStream", resErr(C.ms_stream_create(d.ctx, &s))); err != nil {
		return 0, err
	}
	return device.Stream(s), nil
}

// destroyStream destroys a stream made by createStream (tests).
func (d *Device) destroyStream(s device.Stream) error {
	return d.wrap("destroyStream", resErr(C.ms_stream_destroy(d.ctx, C.uintptr_t(s))))
}

// context returns the primary context handle of d.
func (d *Device) context() uintptr { return uintptr(unsafe.Pointer(d.ctx)) }
