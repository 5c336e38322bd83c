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
	Device        int             `json:"device"`
	Address       uint64          `json:"address"`
	TotalSize     uint64          `json:"total_size"`
	AllocatedSize uint64          `json:"allocated_size"`
	ActiveSize    uint64          `json:"active_size"`
	RequestedSize uint64          `json:"requested_size"`
	Stream        uint64          `json:"stream"`
	SegmentType   string          `json:"segment_type"` // "small" or "large"
	IsExpandable  bool            `json:"is_expandable"`
	Blocks        []BlockSnapshot `json:"blocks"`
}

// Block states in snapshots, as PyTorch names them.
const (
	StateActiveAllocated   = "active_allocated"
	StateActivePendingFree = "active_pending_free"
	StateInactive          = "inactive"
)

// BlockSnapshot is one block of a segment, in address order.
type BlockSnapshot struct {
	Address       uint64 `json:"address"`
	Size          uint64 `json:"size"`
	RequestedSize uint64 `json:"requested_size"`
	State         string `json:"state"`
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
// could not be allocated and Addr is 0.
type TraceEntry struct {
	Action string `json:"action"`
	Addr   uint64 `json:"addr"`
	Size   uint64 `json:"size"`
	Stream uint64 `json:"stream"`
	TimeUS int64  `json:"time_us"`
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
}

// traceRing keeps the most recent events.
type traceRing struct {
	buf  []traceRec
	next int
	full bool
}

func newTraceRing(n int) *traceRing { return &traceRing{buf: make([]traceRec, n)} }

func (r *traceRing) add(act traceAction, addr device.Ptr, size uint64, s device.Stream) {
	r.buf[r.next] = traceRec{action: act, addr: addr, size: size, stream: s, t: time.Now().UnixMicro()}
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
