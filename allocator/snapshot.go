package allocator

import (
	"time"

	"github.com/memscale/memscale/device"
)

// Snapshot is the allocator's state in the shape of
// torch.cuda.memory._snapshot(), so tools written for it (pytorch.org/memory_viz
// reads a pickle of the same dict) understand it. Encode it with
// encoding/json.
type Snapshot struct {
	// Segments lists the memory the allocator holds. An expandable segment
	// is reported as one entry per run of mapped memory, as PyTorch does.
	Segments []SegmentSnapshot `json:"segments"`
	// DeviceTraces holds one list per device (here always one) of the most
	// recent events, oldest first; empty when tracing is off.
	DeviceTraces [][]TraceEntry `json:"device_traces"`
}

// SegmentSnapshot is one entry of Snapshot.Segments.
type SegmentSnapshot struct {
	// Device is the device ordinal.
	Device int `json:"device"`
	// Address is the first byte of the segment (or of the mapped run).
	Address uint64 `json:"address"`
	// TotalSize is the bytes it spans, the sum of its blocks.
	TotalSize uint64 `json:"total_size"`
	// AllocatedSize is the bytes in allocated blocks.
	AllocatedSize uint64 `json:"allocated_size"`
	// ActiveSize is the bytes in allocated and pending-free blocks.
	ActiveSize uint64 `json:"active_size"`
	// RequestedSize is the bytes requested by the active blocks.
	RequestedSize uint64 `json:"requested_size"`
	// Stream is the stream the segment serves.
	Stream uint64 `json:"stream"`
	// SegmentType is "small" or "large" (the pool).
	SegmentType string `json:"segment_type"`
	// IsExpandable is true for VMM-backed segments.
	IsExpandable bool `json:"is_expandable"`
	// Blocks are the segment's blocks in address order.
	Blocks []BlockSnapshot `json:"blocks"`
}

// Block states in snapshots, as PyTorch names them.
const (
	StateActiveAllocated   = "active_allocated"
	StateActivePendingFree = "active_pending_free"
	StateInactive          = "inactive"
)

// BlockSnapshot is one block of a segment, in address order.
type BlockSnapshot struct {
	// Address is the block's first byte.
	Address uint64 `json:"address"`
	// Size is the block's size in bytes.
	Size uint64 `json:"size"`
	// RequestedSize is what the allocation asked for (0 for free blocks).
	RequestedSize uint64 `json:"requested_size"`
	// State is StateActiveAllocated, StateActivePendingFree or StateInactive.
	State string `json:"state"`
}

// Trace actions, as PyTorch names them.
const (
	ActionAlloc         = "alloc"
	ActionFreeRequested = "free_requested"
	ActionFreeCompleted = "free_completed"
	ActionSegmentAlloc  = "segment_alloc"
	ActionSegmentFree   = "segment_free"
	ActionSegmentMap    = "segment_map"
	ActionSegmentUnmap  = "segment_unmap"
	ActionOOM           = "oom"
)

// TraceEntry is one recorded event. For "oom", Size is the block size that
// could not be allocated, Addr is 0 and DeviceFree is set.
type TraceEntry struct {
	// Action is one of the Action constants.
	Action string `json:"action"`
	// Addr is the block's or the mapped range's address.
	Addr uint64 `json:"addr"`
	// Size is its size in bytes.
	Size uint64 `json:"size"`
	// Stream is the stream of the block or segment.
	Stream uint64 `json:"stream"`
	// TimeUS is the wall-clock time in microseconds since the Unix epoch.
	TimeUS int64 `json:"time_us"`
	// DeviceFree is, for "oom" only, the device's free memory in bytes when
	// the allocation failed (PyTorch's field of the same name; nil otherwise).
	DeviceFree *uint64 `json:"device_free,omitempty"`
}

type traceAction uint8

const (
	actAlloc traceAction = iota
	actFreeRequested
	actFreeCompleted
	actSegmentAlloc
	actSegmentFree
	actSegmentMap
	actSegmentUnmap
	actOOM
)

var actionNames = [...]string{
	ActionAlloc, ActionFreeRequested, ActionFreeCompleted, ActionSegmentAlloc,
	ActionSegmentFree, ActionSegmentMap, ActionSegmentUnmap, ActionOOM,
}

type traceRec struct {
	action traceAction
	addr   device.Ptr
	size   uint64
	stream device.Stream
	t      int64
	free   uint64 // device free bytes, for actOOM
}

// traceRing keeps the most recent events.
type traceRing struct {
	buf  []traceRec
	next int
	full bool
}

func newTraceRing(n int) *traceRing { return &traceRing{buf: make([]traceRec, n)} }

func (r *traceRing) add(act traceAction, addr device.Ptr, size uint64, s device.Stream) {
	r.addRec(traceRec{action: act, addr: addr, size: size, stream: s})
}

// addOOM records a failed allocation of size bytes with the device's free memory.
func (r *traceRing) addOOM(size uint64, s device.Stream, free uint64) {
	r.addRec(traceRec{action: actOOM, size: size, stream: s, free: free})
}

func (r *traceRing) addRec(rec traceRec) {
	rec.t = time.Now().UnixMicro()
	r.buf[r.next] = rec
	r.next++
	if r.next == len(r.buf) {
		r.next = 0
		r.full = true
	}
}

func (r *traceRing) entries() []TraceEntry {
	var recs []traceRec
	if r.full {
		recs = append(append(recs, r.buf[r.next:]...), r.buf[:r.next]...)
	} else {
		recs = r.buf[:r.next]
	}
	out := make([]TraceEntry, len(recs))
	for i, x := range recs {
		out[i] = TraceEntry{
			Action: actionNames[x.action],
			Addr:   uint64(x.addr),
			Size:   x.size,
			Stream: uint64(x.stream),
			TimeUS: x.t,
		}
		if x.action == actOOM {
			free := x.free
			out[i].DeviceFree = &free
		}
	}
	return out
}

// Snapshot returns the segments, their blocks and the recorded events.
func (a *Allocator) Snapshot() Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	snap := Snapshot{Segments: []SegmentSnapshot{}, DeviceTraces: [][]TraceEntry{{}}}
	if a.trace != nil {
		snap.DeviceTraces[0] = a.trace.entries()
	}
	for _, seg := range a.segList {
		var cur *SegmentSnapshot
		for b := seg.head; b != nil; b = b.next {
			if b.state == stateUnmapped {
				cur = nil
				continue
			}
			if cur == nil {
				snap.Segments = append(snap.Segments, SegmentSnapshot{
					Device:       a.info.Ordinal,
					Address:      uint64(b.addr),
					Stream:       uint64(seg.stream),
					SegmentType:  seg.pool.String(),
					IsExpandable: seg.expandable,
					Blocks:       []BlockSnapshot{},
				})
				cur = &snap.Segments[len(snap.Segments)-1]
			}
			bs := BlockSnapshot{Address: uint64(b.addr), Size: b.size, State: StateInactive}
			switch b.state {
			case stateAllocated:
				bs.State = StateActiveAllocated
				bs.RequestedSize = b.req
				cur.AllocatedSize += b.size
				cur.ActiveSize += b.size
				cur.RequestedSize += b.req
			case statePending:
				bs.State = StateActivePendingFree
				bs.RequestedSize = b.req
				cur.ActiveSize += b.size
				cur.RequestedSize += b.req
			}
			cur.TotalSize += b.size
			cur.Blocks = append(cur.Blocks, bs)
		}
	}
	return snap
}
