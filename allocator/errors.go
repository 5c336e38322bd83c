package allocator

import (
	"errors"
	"fmt"

	"github.com/memscale/memscale/device"
)

// ErrUnknownPointer is wrapped by the error of Free, RecordStream and friends
// when the pointer is not the start of a live allocation of this allocator
// (never allocated here, or inside an allocation rather than at its start).
var ErrUnknownPointer = errors.New("pointer not allocated by this allocator")

// ErrDoubleFree is wrapped by the error of Free when the pointer lies in
// memory this allocator manages but that memory is already free: the pointer
// was freed before.
var ErrDoubleFree = errors.New("double free")

// ErrInvalidSize is wrapped by the error of Malloc for a size above MaxSize,
// and by the errors of New, SetLimit and SetMemoryFraction for a limit the
// device cannot honour.
var ErrInvalidSize = errors.New("invalid size")

// ErrInvalidArgument is wrapped by errors that report a bad configuration
// value other than a size (a nil device, a NaN fraction, a negative trace
// capacity).
var ErrInvalidArgument = errors.New("invalid argument")

// ErrClosed is wrapped by the errors of every call made after Close.
var ErrClosed = errors.New("allocator closed")

// OOMError reports a request that could not be satisfied: not even after the
// allocator released its cached memory and asked the reclaimer (if any) for
// more. errors.Is(err, device.ErrOutOfMemory) is true for it.
type OOMError struct {
	// Requested is the size asked for, in bytes.
	Requested uint64
	// Rounded is the size of the block that was needed (Requested rounded up).
	Rounded uint64
	// Stream is the stream the allocation was for.
	Stream device.Stream
	// Allocated is the bytes in live allocations when the request failed.
	Allocated uint64
	// Reserved is the physical bytes the allocator held when it failed.
	Reserved uint64
	// Limit is the hard limit on reserved bytes in force.
	Limit uint64
	// DeviceFree is the free memory the device reported, when known.
	DeviceFree uint64
	// Retries is num_alloc_retries so far (this request included).
	Retries int64
	// OOMs is num_ooms so far (this failure included).
	OOMs int64
	// ReclaimerInstalled reports that a Reclaimer was installed when the
	// request failed.
	ReclaimerInstalled bool
	// ReclaimCalls is the number of times this request called the
	// Reclaimer (0 when none is installed, or when it failed for another
	// reason first), and Reclaimed the bytes those calls said they freed.
	ReclaimCalls int
	Reclaimed    uint64
	// Cause is what failed last: the device's error, or nil when the limit
	// alone stopped the request.
	Cause error
}

// Error describes the failure with the numbers PyTorch's message has.
func (e *OOMError) Error() string {
	msg := fmt.Sprintf("allocator: out of memory: tried to allocate %s (%d bytes, block %d bytes) on stream %#x; "+
		"allocated %s (%d bytes), reserved %s (%d bytes), limit %s (%d bytes), device free %s; %s; "+
		"num_alloc_retries=%d num_ooms=%d",
		fmtBytes(e.Requested), e.Requested, e.Rounded, uintptr(e.Stream),
		fmtBytes(e.Allocated), e.Allocated, fmtBytes(e.Reserved), e.Reserved,
		fmtBytes(e.Limit), e.Limit, fmtBytes(e.DeviceFree), e.reclaimText(), e.Retries, e.OOMs)
	if e.Cause != nil {
		return msg + ": " + e.Cause.Error()
	}
	return msg + ": " + device.ErrOutOfMemory.Error()
}

// reclaimText says what the Reclaimer did for the request.
func (e *OOMError) reclaimText() string {
	if !e.ReclaimerInstalled {
		return "no reclaimer installed (nothing was asked to free memory)"
	}
	times := "times"
	if e.ReclaimCalls == 1 {
		times = "time"
	}
	return fmt.Sprintf("the reclaimer was asked %d %s and freed %s (%d bytes)",
		e.ReclaimCalls, times, fmtBytes(e.Reclaimed), e.Reclaimed)
}

// Unwrap returns the cause (which wraps device.ErrOutOfMemory) or
// device.ErrOutOfMemory itself.
func (e *OOMError) Unwrap() error {
	if e.Cause != nil && errors.Is(e.Cause, device.ErrOutOfMemory) {
		return e.Cause
	}
	return device.ErrOutOfMemory
}

// fmtBytes renders a byte count for people: "1.50 GiB".
func fmtBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	suffix := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := -1
	for v >= unit && i < len(suffix)-1 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.2f %s", v, suffix[i])
}
