// Package workload is the allocator-independent stream of allocations and
// frees that `memscale bench replay` runs through every allocator: a list of
// operations in the order the recorded program made them, each on a stream,
// with the frees where the recording freed.
//
// Readers for the formats that hold such a stream live next to it: the DTR
// trace format (memscale's own recorded traces and ../shared/traces/dtr, via
// bench/allocbench) and RMM's replay log (CSV). PyTorch's memory snapshot
// pickle is read by bench/torchsnap.
package workload

import (
	"errors"
	"fmt"
)

// Op is one allocation or free.
type Op struct {
	// Free is false for an allocation, true for a free.
	Free bool
	// ID names the allocation (dense, from 0); a free names the ID of the
	// allocation it frees.
	ID int32
	// Stream is the stream index (dense, from 0) the allocation was made on.
	Stream int32
	// Size is the requested size in bytes (allocations; frees repeat it).
	Size uint64
}

// Workload is a replayable stream of operations.
type Workload struct {
	// Name is the short name used in tables ("mlp-train", "unet").
	Name string
	// Path is the file it was read from.
	Path string
	// Format names the input format ("torch-snapshot", "dtr-trace", "rmm-log").
	Format string
	// Ops are the operations in order.
	Ops []Op
	// Allocs is the number of allocations (IDs are < Allocs).
	Allocs int
	// Streams is the number of distinct streams.
	Streams int
	// Notes are remarks of the reader worth showing the user (events it
	// skipped, frees of memory allocated before the recording started).
	Notes []string
}

// Builder assembles a Workload from allocations and frees named by the
// recording's own keys (addresses, storage names).
type Builder struct {
	w        Workload
	live     map[uint64]int32 // recording key -> ID
	sizes    []uint64         // by ID
	streamOf []int32          // by ID
	streams  map[int64]int32
}

// NewBuilder starts a workload.
func NewBuilder(name, path, format string) *Builder {
	return &Builder{
		w:       Workload{Name: name, Path: path, Format: format},
		live:    map[uint64]int32{},
		streams: map[int64]int32{},
	}
}

// stream maps a recorded stream handle to a dense index.
func (b *Builder) stream(s int64) int32 {
	i, ok := b.streams[s]
	if !ok {
		i = int32(len(b.streams))
		b.streams[s] = i
	}
	return i
}

// ErrDoubleAlloc is returned by Alloc for a key that is already live.
var ErrDoubleAlloc = errors.New("allocation of a key that is still live")

// Alloc records an allocation of size bytes under key on stream.
func (b *Builder) Alloc(key uint64, size uint64, stream int64) error {
	if _, ok := b.live[key]; ok {
		return fmt.Errorf("%w (0x%x)", ErrDoubleAlloc, key)
	}
	id := int32(len(b.sizes))
	st := b.stream(stream)
	b.sizes = append(b.sizes, size)
	b.streamOf = append(b.streamOf, st)
	b.live[key] = id
	b.w.Ops = append(b.w.Ops, Op{ID: id, Stream: st, Size: size})
	return nil
}

// Live reports whether key names a live allocation.
func (b *Builder) Live(key uint64) bool {
	_, ok := b.live[key]
	return ok
}

// Free records the free of key; it reports false when key is not live.
func (b *Builder) Free(key uint64) bool {
	id, ok := b.live[key]
	if !ok {
		return false
	}
	delete(b.live, key)
	b.w.Ops = append(b.w.Ops, Op{Free: true, ID: id, Stream: b.streamOf[id], Size: b.sizes[id]})
	return true
}

// Note adds a remark for the user.
func (b *Builder) Note(format string, args ...any) {
	b.w.Notes = append(b.w.Notes, fmt.Sprintf(format, args...))
}

// Finish returns the workload. Allocations still live stay live (the replay
// frees them at the end).
func (b *Builder) Finish() *Workload {
	w := b.w
	w.Allocs = len(b.sizes)
	w.Streams = max(1, len(b.streams))
	return &w
}

// PeakRequested is the largest sum of live requested bytes along the stream.
func (w *Workload) PeakRequested() uint64 {
	var live, peak uint64
	for _, op := range w.Ops {
		if op.Free {
			live -= op.Size
		} else {
			live += op.Size
			peak = max(peak, live)
		}
	}
	return peak
}

// Validate checks that every free names a live allocation and every ID is
// allocated once.
func (w *Workload) Validate() error {
	state := make([]uint8, w.Allocs) // 0 never, 1 live, 2 freed
	for i, op := range w.Ops {
		if op.ID < 0 || int(op.ID) >= w.Allocs {
			return fmt.Errorf("workload %s: op %d: ID %d out of range [0,%d)", w.Name, i, op.ID, w.Allocs)
		}
		switch {
		case !op.Free && state[op.ID] != 0:
			return fmt.Errorf("workload %s: op %d: ID %d allocated twice", w.Name, i, op.ID)
		case op.Free && state[op.ID] != 1:
			return fmt.Errorf("workload %s: op %d: free of ID %d, which is not live", w.Name, i, op.ID)
		}
		if op.Free {
			state[op.ID] = 2
		} else {
			state[op.ID] = 1
		}
	}
	return nil
}
