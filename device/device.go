// Package device defines what the allocator needs from a GPU: virtual address
// ranges, physical chunks mapped into them at the device's granularity, a plain
// allocate/free fallback, streams and events, host<->device copies and memory
// information.
//
// Two implementations exist: device/cuda reaches the CUDA driver through
// dlopen("libcuda.so.1"), and device/sim emulates a card in host memory with the
// same virtual-memory semantics (touching unmapped memory faults). Everything
// above this package is written against the Device interface only, so the whole
// allocator and engine run and are tested on a machine without a GPU.
package device

import (
	"errors"
	"fmt"
)

// Ptr is a device virtual address.
type Ptr uintptr

// Stream is an opaque stream handle. It is the same value as a cudaStream_t /
// CUstream; 0 is the legacy default stream.
type Stream uintptr

// Event is an opaque event handle created by Device.CreateEvent.
type Event uintptr

// Handle is an opaque handle to a chunk of physical device memory created by
// Device.CreatePhysical.
type Handle uintptr

// Info describes one device.
type Info struct {
	// Backend is "cuda" or "sim".
	Backend string
	// Ordinal is the device index.
	Ordinal int
	// Name is the marketing name ("NVIDIA H100 80GB HBM3", "memscale sim").
	Name string
	// TotalMemory is the capacity in bytes.
	TotalMemory uint64
	// Granularity is the physical allocation granularity of the VMM API in
	// bytes (2 MiB on current NVIDIA GPUs); sizes passed to CreatePhysical and
	// Map must be multiples of it.
	Granularity uint64
	// VMM reports whether the virtual memory management calls are supported.
	VMM bool
	// Peers are the other devices that are granted access to memory mapped
	// with MapRange (cuda: those cuDeviceCanAccessPeer allows).
	Peers []int
}

// Device is one GPU (or its simulation). Implementations are safe for
// concurrent use.
type Device interface {
	// Info describes the device.
	Info() Info
	// MemInfo returns the free and total device memory in bytes.
	MemInfo() (free, total uint64, err error)

	// ReserveAddress reserves size bytes of virtual address space (a multiple of
	// the granularity) with no physical memory behind it.
	ReserveAddress(size uint64) (Ptr, error)
	// FreeAddress returns a range obtained from ReserveAddress. Every mapping in
	// it must have been unmapped first.
	FreeAddress(base Ptr, size uint64) error
	// CreatePhysical creates size bytes of physical memory (a multiple of the
	// granularity). It counts against the device capacity.
	CreatePhysical(size uint64) (Handle, error)
	// ReleasePhysical frees physical memory that is no longer mapped.
	ReleasePhysical(h Handle) error
	// Map maps the whole of h at addr (inside a reserved range) and makes it
	// readable and writable by the device.
	Map(addr Ptr, size uint64, h Handle) error
	// MapRange maps the handles hs, each of size each bytes, one after
	// another from addr, and makes the whole range readable and writable with
	// one access call (PyTorch sets access once per range). On failure
	// nothing of it stays mapped.
	MapRange(addr Ptr, each uint64, hs []Handle) error
	// Unmap removes the mappings of [addr, addr+size), one or several
	// adjacent whole mappings; touching the range afterwards faults.
	Unmap(addr Ptr, size uint64) error

	// Alloc is the non-VMM fallback: size bytes of mapped device memory.
	Alloc(size uint64) (Ptr, error)
	// Free releases memory obtained from Alloc.
	Free(p Ptr) error

	// CheckStream reports an error naming the problem when work of this
	// device cannot be ordered on stream s (a stream of another device).
	CheckStream(s Stream) error
	// CreateEvent creates an event for cross-stream synchronization.
	CreateEvent() (Event, error)
	// RecordEvent captures the work submitted to s so far in e.
	RecordEvent(e Event, s Stream) error
	// QueryEvent reports whether all the work captured by e has completed.
	QueryEvent(e Event) (bool, error)
	// SynchronizeEvent blocks until the work captured by e has completed.
	SynchronizeEvent(e Event) error
	// DestroyEvent frees an event.
	DestroyEvent(e Event) error
	// Synchronize blocks until all work on the device has completed.
	Synchronize() error

	// AllocHost allocates size bytes of page-locked host memory for swapping.
	AllocHost(size uint64) (uintptr, error)
	// FreeHost frees memory obtained from AllocHost.
	FreeHost(p uintptr) error
	// CopyToHost copies n bytes from device address src to host address dst,
	// ordered on stream s, and waits for it to finish.
	CopyToHost(dst uintptr, src Ptr, n uint64, s Stream) error
	// CopyToDevice copies n bytes from host address src to device address dst,
	// ordered on stream s, and waits for it to finish.
	CopyToDevice(dst Ptr, src uintptr, n uint64, s Stream) error

	// Close releases everything the device object holds.
	Close() error
}

// ErrOutOfMemory is wrapped by every error that reports exhausted device
// memory, so callers can tell it from other failures with errors.Is.
var ErrOutOfMemory = errors.New("device out of memory")

// ErrUnavailable is wrapped by errors that report a backend that cannot be used
// on this machine (no driver, no device).
var ErrUnavailable = errors.New("device backend unavailable")

// OutOfMemoryError reports a failed request for device memory.
type OutOfMemoryError struct {
	// Op is the call that failed ("CreatePhysical", "Alloc").
	Op string
	// Requested is the size asked for in bytes.
	Requested uint64
	// Free is what the device reported as free, when known.
	Free uint64
}

func (e *OutOfMemoryError) Error() string {
	return fmt.Sprintf("%s: %d bytes requested, %d bytes free: %v", e.Op, e.Requested, e.Free, ErrOutOfMemory)
}

// Unwrap makes errors.Is(err, ErrOutOfMemory) true.
func (e *OutOfMemoryError) Unwrap() error { return ErrOutOfMemory }
