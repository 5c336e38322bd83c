// Package torchsnap reads PyTorch memory snapshots - the pickle that
// torch.cuda.memory._dump_snapshot writes after
// torch.cuda.memory._record_memory_history() (and memscale.record_snapshot) -
// and turns their alloc/free history into a workload.Workload.
//
// The pickle holds {"segments": [...], "device_traces": [[TraceEntry...], ...]}
// (torch.cuda.memory._snapshot's documented shape). For one device the
// reader takes, in order: "alloc" entries (addr, size = the requested size,
// stream) and the matching frees. A free is taken where the memory went back
// to the allocator: "free_completed" when the trace has such entries (a block
// used on other streams is only reusable then), else "free_requested" or the
// older "free". Segment, oom, snapshot and annotation entries are not
// replayed. The history is a ring (max_entries): memory freed in the window
// but allocated before it, and memory still allocated in "segments" at the
// end that the window never saw allocated, are allocated at the start of the
// replay, so peaks count it.
package torchsnap

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"sort"
	"strings"

	"github.com/nlpodyssey/gopickle/pickle"
	"github.com/nlpodyssey/gopickle/types"

	"github.com/memscale/memscale/bench/workload"
)

// Options select what to read.
type Options struct {
	// Device is the device index whose history is read; -1 picks the device
	// with the most alloc entries.
	Device int
}

// Entry is one trace entry of a snapshot.
type Entry struct {
	// Action is the entry's action ("alloc", "free_requested", ...).
	Action string
	// Addr, Size and Stream are the entry's fields (0 when absent).
	Addr, Size uint64
	Stream     int64
}

// Segment is one segment of a snapshot's "segments" list (the state at the
// time of the snapshot).
type Segment struct {
	// Device, Address, TotalSize and Stream are the segment's fields.
	Device    int
	Address   uint64
	TotalSize uint64
	Stream    int64
	// Blocks are its blocks.
	Blocks []Block
}

// Block is one block of a segment.
type Block struct {
	// Address, Size and RequestedSize are the block's fields.
	Address, Size, RequestedSize uint64
	// State is active_allocated, active_pending_free/active_awaiting_free or inactive.
	State string
}

// Snapshot is the decoded part of a snapshot pickle.
type Snapshot struct {
	// Segments is the state at the time of the snapshot.
	Segments []Segment
	// Traces holds each device's trace entries.
	Traces [][]Entry
}

// countingReader counts the bytes consumed, for error positions.
type countingReader struct {
	r *bufio.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.n++
	}
	return b, err
}

// hint is appended to structural errors.
const hint = "want the pickle that torch.cuda.memory._dump_snapshot (or memscale.record_snapshot) writes"

// ReadFile reads the snapshot at path.
func ReadFile(path string) (*Snapshot, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("torchsnap: %w", err)
	}
	defer f.Close()
	s, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("torchsnap: %s: %w", path, err)
	}
	return s, nil
}

// Read decodes a snapshot pickle from r. The whole pickle is read first and
// its opcodes checked against its length (scan), so a truncated or corrupt
// file gives an error naming the byte offset and never makes the decoder
// allocate more than the file holds.
func Read(r io.Reader) (snap *Snapshot, err error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("empty file: %s", hint)
	}
	if data[0] != 0x80 {
		return nil, fmt.Errorf("byte 0 is 0x%02x, not a pickle protocol marker (0x80): %s", data[0], hint)
	}
	if err := scan(data); err != nil {
		return nil, fmt.Errorf("%w: %s", err, hint)
	}
	cr := &countingReader{r: bufio.NewReader(bytes.NewReader(data))}
	var obj any
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("corrupt pickle near byte %d: %v", cr.n, p)
			}
		}()
		u := pickle.NewUnpickler(cr)
		obj, err = u.Load()
	}()
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("truncated pickle: the file ends at byte %d before the pickle's STOP: %s", len(data), hint)
		}
		if strings.HasPrefix(err.Error(), "corrupt pickle") {
			return nil, fmt.Errorf("%w: %s", err, hint)
		}
		return nil, fmt.Errorf("corrupt pickle near byte %d: %w: %s", cr.n, err, hint)
	}
	return decode(obj)
}

// decode walks the unpickled object.
func decode(obj any) (*Snapshot, error) {
	top, ok := obj.(*types.Dict)
	if !ok {
		return nil, fmt.Errorf("the pickle holds a %T, not a dict with 'segments' and 'device_traces': %s", obj, hint)
	}
	tracesObj, ok := top.Get("device_traces")
	if !ok {
		return nil, fmt.Errorf("the pickled dict has no 'device_traces' (keys: %s): %s", strings.Join(keys(top), ", "), hint)
	}
	s := &Snapshot{}
	devs, ok := tracesObj.(*types.List)
	if !ok {
		return nil, fmt.Errorf("'device_traces' is a %T, not a list: %s", tracesObj, hint)
	}
	for d, dv := range *devs {
		lst, ok := dv.(*types.List)
		if !ok {
			return nil, fmt.Errorf("device_traces[%d] is a %T, not a list: %s", d, dv, hint)
		}
		es := make([]Entry, 0, len(*lst))
		for i, ev := range *lst {
			e, err := entry(ev)
			if err != nil {
				return nil, fmt.Errorf("device_traces[%d][%d]: %w", d, i, err)
			}
			es = append(es, e)
		}
		s.Traces = append(s.Traces, es)
	}
	if segObj, ok := top.Get("segments"); ok && segObj != nil {
		segs, ok := segObj.(*types.List)
		if !ok {
			return nil, fmt.Errorf("'segments' is a %T, not a list: %s", segObj, hint)
		}
		for i, sv := range *segs {
			seg, err := segment(sv)
			if err != nil {
				return nil, fmt.Errorf("segments[%d]: %w", i, err)
			}
			s.Segments = append(s.Segments, seg)
		}
	}
	return s, nil
}

func keys(d *types.Dict) []string {
	var out []string
	for _, e := range *d {
		out = append(out, fmt.Sprint(e.Key))
	}
	return out
}

// entry decodes one TraceEntry dict.
func entry(v any) (Entry, error) {
	d, ok := v.(*types.Dict)
	if !ok {
		return Entry{}, fmt.Errorf("a %T, not a dict", v)
	}
	var e Entry
	a, ok := d.Get("action")
	if !ok {
		return e, errors.New("no 'action'")
	}
	if e.Action, ok = a.(string); !ok {
		return e, fmt.Errorf("'action' is a %T, not a string", a)
	}
	var err error
	if e.Addr, err = uintField(d, "addr"); err != nil {
		return e, err
	}
	if e.Size, err = uintField(d, "size"); err != nil {
		return e, err
	}
	st, err := intField(d, "stream")
	if err != nil {
		return e, err
	}
	e.Stream = st
	return e, nil
}

// segment decodes one Segment dict.
func segment(v any) (Segment, error) {
	d, ok := v.(*types.Dict)
	if !ok {
		return Segment{}, fmt.Errorf("a %T, not a dict", v)
	}
	var s Segment
	var err error
	dev, err := intField(d, "device")
	if err != nil {
		return s, err
	}
	s.Device = int(dev)
	if s.Address, err = uintField(d, "address"); err != nil {
		return s, err
	}
	if s.TotalSize, err = uintField(d, "total_size"); err != nil {
		return s, err
	}
	if s.Stream, err = intField(d, "stream"); err != nil {
		return s, err
	}
	bl, ok := d.Get("blocks")
	if !ok || bl == nil {
		return s, nil
	}
	lst, ok := bl.(*types.List)
	if !ok {
		return s, fmt.Errorf("'blocks' is a %T, not a list", bl)
	}
	for i, bv := range *lst {
		bd, ok := bv.(*types.Dict)
		if !ok {
			return s, fmt.Errorf("blocks[%d] is a %T, not a dict", i, bv)
		}
		var b Block
		if b.Address, err = uintField(bd, "address"); err != nil {
			return s, fmt.Errorf("blocks[%d]: %w", i, err)
		}
		if b.Size, err = uintField(bd, "size"); err != nil {
			return s, fmt.Errorf("blocks[%d]: %w", i, err)
		}
		if b.RequestedSize, err = uintField(bd, "requested_size"); err != nil {
			return s, fmt.Errorf("blocks[%d]: %w", i, err)
		}
		if b.RequestedSize == 0 {
			b.RequestedSize = b.Size
		}
		if st, ok := bd.Get("state"); ok {
			b.State, _ = st.(string)
		}
		s.Blocks = append(s.Blocks, b)
	}
	return s, nil
}

// intField reads an optional integer field (absent or None = 0).
func intField(d *types.Dict, key string) (int64, error) {
	v, ok := d.Get(key)
	if !ok || v == nil {
		return 0, nil
	}
	switch x := v.(type) {
	case int:
		return int64(x), nil
	case bool:
		if x {
			return 1, nil
		}
		return 0, nil
	case *big.Int:
		if x.IsInt64() {
			return x.Int64(), nil
		}
		if x.IsUint64() {
			return int64(x.Uint64()), nil
		}
	}
	return 0, fmt.Errorf("'%s' is %v (%T), not an integer", key, v, v)
}

// uintField reads an optional non-negative integer field.
func uintField(d *types.Dict, key string) (uint64, error) {
	v, ok := d.Get(key)
	if ok {
		if b, isBig := v.(*big.Int); isBig && b.IsUint64() {
			return b.Uint64(), nil
		}
	}
	n, err := intField(d, key)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("'%s' is negative (%d)", key, n)
	}
	return uint64(n), nil
}

// Workload turns the snapshot's history on one device into a workload.
func (s *Snapshot) Workload(name, path string, opt Options) (*workload.Workload, error) {
	dev := opt.Device
	if dev < 0 {
		best := -1
		for d, t := range s.Traces {
			n := 0
			for _, e := range t {
				if e.Action == "alloc" {
					n++
				}
			}
			if n > best {
				dev, best = d, n
			}
		}
	}
	if dev < 0 || dev >= len(s.Traces) {
		return nil, fmt.Errorf("device %d: the snapshot has traces for %d device(s)", opt.Device, len(s.Traces))
	}
	trace := s.Traces[dev]
	freeAction := "free_completed"
	has := map[string]bool{}
	for _, e := range trace {
		has[e.Action] = true
	}
	switch {
	case has["free_completed"]:
	case has["free_requested"]:
		freeAction = "free_requested"
	default:
		freeAction = "free"
	}
	if !has["alloc"] {
		return nil, fmt.Errorf("device %d has no alloc entries in its history (%d entries): record with torch.cuda.memory._record_memory_history() (or memscale.record_snapshot) before the run", dev, len(trace))
	}

	// Pass 1: which frees name memory allocated before the window, and
	// which blocks are still allocated at the end without an alloc in it.
	type pre struct {
		addr, size uint64
		stream     int64
	}
	var pres []pre
	live := map[uint64]bool{}
	for _, e := range trace {
		switch e.Action {
		case "alloc":
			live[e.Addr] = true
		case freeAction:
			if !live[e.Addr] {
				pres = append(pres, pre{e.Addr, e.Size, e.Stream})
			}
			delete(live, e.Addr)
		}
	}
	nWindow := len(pres)
	var atEnd []pre
	for _, seg := range s.Segments {
		if seg.Device != dev {
			continue
		}
		for _, b := range seg.Blocks {
			if b.State == "active_allocated" && !live[b.Address] {
				atEnd = append(atEnd, pre{b.Address, b.RequestedSize, seg.Stream})
			}
		}
	}
	sort.Slice(atEnd, func(i, j int) bool { return atEnd[i].addr < atEnd[j].addr })

	b := workload.NewBuilder(name, path, "torch-snapshot")
	// Memory live before the window that stays live to the end may share an
	// address with memory freed in the window before it; the end-state
	// blocks are keyed apart so that they never collide.
	const endKey = uint64(1) << 63
	for _, p := range atEnd {
		if err := b.Alloc(p.addr|endKey, p.size, p.stream); err != nil {
			return nil, fmt.Errorf("device %d: segments: %w", dev, err)
		}
	}
	for _, p := range pres {
		if err := b.Alloc(p.addr, p.size, p.stream); err != nil {
			// Freed twice before any alloc in the window: the ring dropped
			// the alloc in between; keep the first.
			continue
		}
	}
	doubled := 0
	for i, e := range trace {
		switch e.Action {
		case "alloc":
			if b.Live(e.Addr) {
				// A free the ring dropped: free it here.
				b.Free(e.Addr)
				doubled++
			}
			if err := b.Alloc(e.Addr, e.Size, e.Stream); err != nil {
				return nil, fmt.Errorf("device %d: entry %d: %w", dev, i, err)
			}
		case freeAction:
			b.Free(e.Addr)
		}
	}
	if nWindow > 0 {
		b.Note("%d allocations freed in the history but made before it began are allocated at the start", nWindow)
	}
	if len(atEnd) > 0 {
		b.Note("%d blocks allocated at the snapshot but never seen allocated in the history are allocated at the start", len(atEnd))
	}
	if doubled > 0 {
		b.Note("%d addresses allocated again without a free in between (free assumed just before)", doubled)
	}
	if freeAction != "free_completed" {
		b.Note("frees taken at %q entries (no free_completed in the history)", freeAction)
	}
	return b.Finish(), nil
}
