package main

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "memscale_internal.h"
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/memscale/memscale/autotune"
	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/config"
	rc "github.com/memscale/memscale/recompute"
)

// allocatedSource is what an engine with "usage": "allocator" reads of a
// device's allocator (*allocator.Allocator).
type allocatedSource interface {
	Allocated() uint64
	Watermark() uint64
	ResetWatermark()
}

// allocatorUsage returns the allocator of a device, for engines created with
// "usage": "allocator". It is assigned by the allocator side of package main
// (state.go); while it is nil such engines cannot be created.
var allocatorUsage func(device int) (allocatedSource, error)

// dtrHandle is one engine created by memscale_dtr_create. Calls on one
// handle are serialized by mu; different handles run in parallel.
type dtrHandle struct {
	mu  sync.Mutex
	eng *evict.Engine // nil once destroyed
	src evict.UsageSource
	buf []evict.Victim
	pl  []rc.Step
	// Scratch of memscale_dtr_op, reused by every call (the engine copies
	// what it keeps), and the op names seen, interned so a call allocates
	// no string for a name it has seen before.
	ins   []rc.TensorID
	outs  []evict.Output
	names map[string]string
	// The names of memscale_dtr_name, by id, and their ids.
	nameList []string
	nameIDs  map[string]int64
	// status is the block memscale_dtr_status_of returns: C memory, owned
	// by the handle, rewritten at the end of every call on it (sync) and
	// freed by memscale_dtr_destroy.
	status *C.memscale_dtr_status
	// wantLeast: created with "least_budget": true; least is the search's
	// result once the step finished (least.go).
	wantLeast bool
	least     *leastStats
}

// liveStatusBlocks counts the status blocks allocated and not freed yet
// (the tests check that destroy frees them).
var liveStatusBlocks atomic.Int64

// newDTRHandle returns a handle for eng with its status block.
func newDTRHandle(eng *evict.Engine, src evict.UsageSource) (*dtrHandle, error) {
	d := &dtrHandle{eng: eng, src: src}
	d.status = (*C.memscale_dtr_status)(C.calloc(1, C.sizeof_memscale_dtr_status))
	if d.status == nil {
		return nil, fmt.Errorf("out of host memory for the status block (%d bytes)", C.sizeof_memscale_dtr_status)
	}
	liveStatusBlocks.Add(1)
	d.sync()
	return d, nil
}

// sync rewrites the status block from the engine.
func (d *dtrHandle) sync() {
	if d.eng == nil || d.status == nil {
		return
	}
	st := d.eng.Status()
	*d.status = C.memscale_dtr_status{
		usage:         C.int64_t(st.Usage),
		budget:        C.int64_t(st.Budget),
		pending:       C.int64_t(d.eng.Pending()),
		bytes_evicted: C.int64_t(st.BytesEvicted),
		peak_usage:    C.int64_t(st.PeakUsage),
		next_op:       C.int64_t(d.eng.Graph().NumOps()),
		next_tensor:   C.int64_t(d.eng.Graph().NumTensors()),
	}
}

// close frees the status block and marks the handle destroyed. The caller
// holds d.mu.
func (d *dtrHandle) close() {
	if d.status != nil {
		C.free(unsafe.Pointer(d.status))
		d.status = nil
		liveStatusBlocks.Add(-1)
	}
	d.eng = nil
}

// dtrEngines maps handles (> 0) to engines.
var dtrEngines = struct {
	sync.Mutex
	m    map[int64]*dtrHandle
	next int64
}{m: map[int64]*dtrHandle{}}

var errNilArray = errors.New("NULL array with a positive length")

func dtrLookup(h C.int64_t) (*dtrHandle, error) {
	dtrEngines.Lock()
	defer dtrEngines.Unlock()
	d, ok := dtrEngines.m[int64(h)]
	if !ok {
		return nil, fmt.Errorf("unknown engine handle %d", int64(h))
	}
	return d, nil
}

// withEngine runs fn on handle h under its lock, inside guard, then
// updates the handle's status block, whether fn failed or not.
func withEngine(name string, h C.int64_t, fn func(d *dtrHandle) error) (failed bool) {
	return guard(name, func() error {
		d, err := dtrLookup(h)
		if err != nil {
			return err
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.eng == nil {
			// destroyed by another thread between the lookup and the lock
			return fmt.Errorf("unknown engine handle %d (destroyed)", int64(h))
		}
		defer d.sync()
		return fn(d)
	})
}

// cArray views a C array of n elements (nil for n == 0).
func cArray[T any](p *T, n C.int32_t, what string) ([]T, error) {
	if n < 0 {
		return nil, fmt.Errorf("%s: negative length %d", what, int32(n))
	}
	if n == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, fmt.Errorf("%s: %w (%d)", what, errNilArray, int32(n))
	}
	return unsafe.Slice(p, int(n)), nil
}

func tensorIDs(p *C.int64_t, n C.int32_t) ([]rc.TensorID, error) {
	xs, err := cArray(p, n, "inputs")
	if err != nil {
		return nil, err
	}
	ids := make([]rc.TensorID, len(xs))
	for i, x := range xs {
		ids[i] = rc.TensorID(x)
	}
	return ids, nil
}

func opFlags(f C.int32_t) (rc.OpFlags, error) {
	if f&^1 != 0 {
		return 0, fmt.Errorf("flags %#x: unknown bits (bit 0 = NO_RECOMPUTE is the only flag)", int32(f))
	}
	var out rc.OpFlags
	if f&1 != 0 {
		out |= rc.NoRecompute
	}
	return out, nil
}

func opName(name *C.char) string {
	if name == nil {
		return "op"
	}
	return C.GoString(name)
}

// dtrDefaults returns the engine defaults from the environment
// (MEMSCALE_HEURISTIC, MEMSCALE_RECOMP_*_FACTOR, MEMSCALE_EVICTEE_MIN_SIZE)
// and which of them it sets. Unlike the allocator's configuration, read once
// per process (loadProcess), they are read from libc's environment at every
// memscale_dtr_create, so a host that changes a variable with setenv
// between two engines (a test's monkeypatch.setenv) gets it.
func dtrDefaults() (evict.Defaults, error) {
	pc, err := config.Load(cLookupEnv)
	if err != nil {
		return evict.Defaults{}, fmt.Errorf("bad memscale configuration in the environment: %w", err)
	}
	h, err := evict.ParseHeuristic(string(pc.Heuristic))
	if err != nil {
		return evict.Defaults{}, fmt.Errorf("%s: %w", config.EnvHeuristic, err)
	}
	set := func(name string) bool {
		v, ok := cLookupEnv(name)
		return ok && strings.TrimSpace(v) != ""
	}
	return evict.Defaults{
		Config: evict.Config{
			Heuristic:          h,
			RecompTimeFactor:   pc.RecompTimeFactor,
			RecompMemoryFactor: pc.RecompMemoryFactor,
			EvicteeMinSize:     pc.EvicteeMinSize,
		},
		HeuristicSet:      set(config.EnvHeuristic),
		EvicteeMinSizeSet: set(config.EnvEvicteeMinSize),
	}, nil
}

// The engine's exports are memscale_go_dtr_*. The public memscale_dtr_*
// symbols are C wrappers in abi.c that check the fork guard first, so a
// forked child never enters the Go runtime; memscale_internal.h declares
// these exports, and cgo checks the declarations against its own. The
// names given to guard are the public ones, so errors name the function the
// caller called.

//export memscale_go_dtr_create
func memscale_go_dtr_create(configJSON *C.char) C.int64_t {
	h := int64(-1)
	guard("memscale_dtr_create", func() error {
		defaults, err := dtrDefaults()
		if err != nil {
			return err
		}
		var data []byte
		if configJSON != nil {
			data = []byte(C.GoString(configJSON))
		}
		data, wantLeast, err := takeLeastKey(data)
		if err != nil {
			return err
		}
		cfg, src, err := defaults.Decode(data)
		if err != nil {
			return err
		}
		cfg.Record = cfg.Record || wantLeast
		if src.Allocator {
			usage := allocatorUsage
			if usage == nil {
				return errors.New(`"usage": "allocator": the allocator usage source is not available in this build`)
			}
			dev := src.Device
			a, err := usage(dev)
			if err != nil {
				return fmt.Errorf(`"usage": "allocator", device %d: %w`, dev, err)
			}
			a.ResetWatermark() // the engine's peak is its own
			var last, lastPeak uint64
			cfg.Usage = func() uint64 {
				// The device was opened above; an error now leaves the
				// last known value.
				if a, err := usage(dev); err == nil {
					last = a.Allocated()
				}
				return last
			}
			cfg.UsagePeak = func() uint64 {
				if a, err := usage(dev); err == nil {
					lastPeak = a.Watermark()
				}
				return lastPeak
			}
		}
		eng, err := evict.New(cfg)
		if err != nil {
			return err
		}
		d, err := newDTRHandle(eng, src)
		if err != nil {
			return err
		}
		d.wantLeast = wantLeast
		dtrEngines.Lock()
		dtrEngines.next++
		id := dtrEngines.next
		dtrEngines.m[id] = d
		dtrEngines.Unlock()
		if src.Allocator {
			// The allocator's cache bound follows the budget (autobudget.go).
			if err := registerEngineBudget(src.Device, id, eng.Stats().Budget); err != nil {
				dtrEngines.Lock()
				delete(dtrEngines.m, id)
				dtrEngines.Unlock()
				d.mu.Lock()
				d.close()
				d.mu.Unlock()
				return err
			}
		}
		h = id
		liveEngines.Add(1)
		return nil
	})
	return C.int64_t(h)
}

//export memscale_go_dtr_destroy
func memscale_go_dtr_destroy(h C.int64_t) C.int {
	if guard("memscale_dtr_destroy", func() error {
		dtrEngines.Lock()
		d, ok := dtrEngines.m[int64(h)]
		delete(dtrEngines.m, int64(h))
		dtrEngines.Unlock()
		if !ok {
			return fmt.Errorf("unknown engine handle %d", int64(h))
		}
		liveEngines.Add(-1)
		// A call on another thread that looked the handle up before the
		// delete finishes first; one that locks after this sees it closed.
		d.mu.Lock()
		defer d.mu.Unlock()
		d.close()
		if d.src.Allocator {
			return registerEngineBudget(d.src.Device, int64(h), 0)
		}
		return nil
	}) {
		return -1
	}
	return 0
}

//export memscale_go_dtr_set_budget
func memscale_go_dtr_set_budget(h C.int64_t, bytes C.int64_t) C.int {
	if withEngine("memscale_dtr_set_budget", h, func(d *dtrHandle) error {
		if bytes < 0 {
			return fmt.Errorf("budget %d: want bytes >= 0 (0 = unlimited)", int64(bytes))
		}
		d.eng.SetBudget(uint64(bytes))
		if d.src.Allocator {
			return registerEngineBudget(d.src.Device, int64(h), d.eng.Stats().Budget)
		}
		return nil
	}) {
		return -1
	}
	return 0
}

//export memscale_go_dtr_tensor
func memscale_go_dtr_tensor(h C.int64_t, nbytes C.int64_t, pinned C.int32_t) C.int64_t {
	id := int64(-1)
	withEngine("memscale_dtr_tensor", h, func(d *dtrHandle) error {
		if nbytes < 0 {
			return fmt.Errorf("nbytes %d: want >= 0", int64(nbytes))
		}
		t, err := d.eng.AddTensor(uint64(nbytes), pinned != 0)
		if err != nil {
			return err
		}
		id = int64(t)
		return nil
	})
	return C.int64_t(id)
}

// opCall holds what memscale_dtr_call and memscale_dtr_mutate share: the
// inputs, the flags, the cost and the out_ids array of n entries.
type opCall struct {
	ins   []rc.TensorID
	flags rc.OpFlags
	cost  int64
	dst   []C.int64_t
}

func newOpCall(inputs *C.int64_t, nIn C.int32_t, costNS C.int64_t, flags C.int32_t, outIDs *C.int64_t, n C.int32_t) (opCall, error) {
	var c opCall
	var err error
	if c.ins, err = tensorIDs(inputs, nIn); err != nil {
		return c, err
	}
	if c.dst, err = cArray(outIDs, n, "out_ids"); err != nil {
		return c, err
	}
	if c.flags, err = opFlags(flags); err != nil {
		return c, err
	}
	if costNS < 0 {
		return c, fmt.Errorf("cost_ns %d: want >= 0", int64(costNS))
	}
	c.cost = int64(costNS)
	return c, nil
}

// run marks the inputs read, runs record (Call or Mutate) and writes the
// new tensor ids to out_ids.
func (c opCall) run(e *evict.Engine, record func() (rc.OpID, []rc.TensorID, error)) (int64, error) {
	for _, in := range c.ins {
		if err := e.Access(in); err != nil {
			return -1, err
		}
	}
	id, ids, err := record()
	if err != nil {
		return -1, err
	}
	for i, t := range ids {
		c.dst[i] = C.int64_t(t)
	}
	return int64(id), nil
}

//export memscale_go_dtr_call
func memscale_go_dtr_call(h C.int64_t, name *C.char, inputs *C.int64_t, nIn C.int32_t,
	outSizes *C.int64_t, outAlias *C.int32_t, nOut C.int32_t,
	costNS C.int64_t, flags C.int32_t, outIDs *C.int64_t) C.int64_t {
	op := int64(-1)
	withEngine("memscale_dtr_call", h, func(d *dtrHandle) error {
		c, err := newOpCall(inputs, nIn, costNS, flags, outIDs, nOut)
		if err != nil {
			return err
		}
		sizes, err := cArray(outSizes, nOut, "out_sizes")
		if err != nil {
			return err
		}
		alias, err := cArray(outAlias, nOut, "out_alias")
		if err != nil {
			return err
		}
		outs := make([]evict.Output, nOut)
		for i := range outs {
			if sizes[i] < 0 {
				return fmt.Errorf("out_sizes[%d] = %d: want >= 0", i, int64(sizes[i]))
			}
			outs[i] = evict.Output{Size: uint64(sizes[i]), Alias: int32(alias[i])}
		}
		op, err = c.run(d.eng, func() (rc.OpID, []rc.TensorID, error) {
			return d.eng.Call(opName(name), c.ins, outs, c.cost, c.flags)
		})
		return err
	})
	return C.int64_t(op)
}

// Layout of memscale_dtr_op's frame (see memscale.h).
const (
	frameReleases = 0 // number of released tensor ids
	frameInputs   = 1 // number of inputs (-1: releases only)
	frameOutputs  = 2 // number of outputs
	frameCost     = 3 // cost_ns
	frameFlags    = 4 // flags
	frameCap      = 5 // room for freed storages handed out
	frameHeader   = 6
)

// internName returns the op name at p (NUL-terminated) as a Go string,
// allocating only the first time the handle sees that name.
func (d *dtrHandle) internName(p *C.char) string {
	if p == nil {
		return "op"
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(p)), int(C.strlen(p)))
	if s, ok := d.names[string(b)]; ok { // no allocation for the lookup
		return s
	}
	if d.names == nil {
		d.names = map[string]string{}
	}
	s := string(b)
	d.names[s] = s
	return s
}

// op is memscale_dtr_op on a locked handle: the releases, then the op (as
// memscale_dtr_call), then up to cap freed storages handed out. It reads
// every input of the frame before writing any output to it.
func (d *dtrHandle) op(name *C.char, frame *C.int64_t) (int64, error) {
	if frame == nil {
		return -1, errors.New("frame: NULL")
	}
	hdr := unsafe.Slice(frame, frameHeader)
	r := opRecord{nRel: int64(hdr[frameReleases]), nIn: int64(hdr[frameInputs]), nOut: int64(hdr[frameOutputs]),
		cost: int64(hdr[frameCost]), flags: int64(hdr[frameFlags])}
	capacity := int64(hdr[frameCap])
	if err := r.check(); err != nil {
		return -1, fmt.Errorf("frame header: %w", err)
	}
	if capacity < 0 || capacity > mostPerFrame {
		return -1, fmt.Errorf("frame[5] = %d handed-out slots: want 0..%d", capacity, mostPerFrame)
	}
	if r.nIn < 0 {
		capacity = 0
	}
	body := unsafe.Slice((*C.int64_t)(unsafe.Add(unsafe.Pointer(frame), frameHeader*8)), int(r.words()))
	op, ids, err := d.apply(d.internName(name), r, body)
	if err != nil || r.nIn < 0 {
		return op, err
	}
	// Outputs: the new ids, then the freed storages handed out.
	out := unsafe.Slice(frame, int(1+r.nOut+2*capacity))
	for i, t := range ids {
		out[i] = C.int64_t(t)
	}
	out[r.nOut] = C.int64_t(d.handOut(out[r.nOut+1:], capacity))
	return op, nil
}

// mostPerFrame bounds every count in a frame (ids, inputs, outputs, slots).
const mostPerFrame = 1 << 24

// opRecord is the header of one op in a frame: memscale_dtr_op's, or one
// record of memscale_dtr_ops'.
type opRecord struct {
	nRel, nIn, nOut, cost, flags int64
}

// check validates the record's counts (nIn -1: releases only).
func (r *opRecord) check() error {
	switch {
	case r.nRel < 0 || r.nRel > mostPerFrame:
		return fmt.Errorf("%d released ids: want 0..%d", r.nRel, mostPerFrame)
	case r.nIn < -1 || r.nIn > mostPerFrame:
		return fmt.Errorf("%d inputs: want -1 (releases only) .. %d", r.nIn, mostPerFrame)
	case r.nIn >= 0 && (r.nOut < 0 || r.nOut > mostPerFrame):
		return fmt.Errorf("%d outputs: want 0..%d", r.nOut, mostPerFrame)
	case r.cost < 0:
		return fmt.Errorf("cost_ns %d: want >= 0", r.cost)
	}
	if r.nIn < 0 {
		r.nOut = 0
	}
	return nil
}

// words is the length of the record's body: releases, inputs, sizes, aliases.
func (r *opRecord) words() int64 { return r.nRel + max(r.nIn, 0) + 2*r.nOut }

// apply carries out a checked record whose body is body: the releases, then
// (nIn >= 0) the op's inputs read and the op registered. It returns the op
// id (0 for releases only) and the output ids, valid until the next call.
func (d *dtrHandle) apply(name string, r opRecord, body []C.int64_t) (int64, []rc.TensorID, error) {
	for i, t := range body[:r.nRel] {
		if err := d.eng.Release(rc.TensorID(t)); err != nil {
			return -1, nil, fmt.Errorf("released id %d of %d: %w", i, r.nRel, err)
		}
	}
	if r.nIn < 0 {
		return 0, nil, nil
	}
	f, err := opFlags(C.int32_t(r.flags))
	if err != nil {
		return -1, nil, err
	}
	body = body[r.nRel:]
	d.ins = d.ins[:0]
	for _, t := range body[:r.nIn] {
		d.ins = append(d.ins, rc.TensorID(t))
	}
	sizes, alias := body[r.nIn:r.nIn+r.nOut], body[r.nIn+r.nOut:r.nIn+2*r.nOut]
	d.outs = d.outs[:0]
	for i := range r.nOut {
		if sizes[i] < 0 {
			return -1, nil, fmt.Errorf("output %d: size %d: want >= 0", i, int64(sizes[i]))
		}
		if alias[i] < -1 || alias[i] >= C.int64_t(r.nIn) {
			return -1, nil, fmt.Errorf("output %d: alias %d: want -1 or an input index", i, int64(alias[i]))
		}
		d.outs = append(d.outs, evict.Output{Size: uint64(sizes[i]), Alias: int32(alias[i])})
	}
	for _, in := range d.ins {
		if err := d.eng.Access(in); err != nil {
			return -1, nil, err
		}
	}
	op, ids, err := d.eng.Call(name, d.ins, d.outs, r.cost, f)
	if err != nil {
		return -1, nil, err
	}
	return int64(op), ids, nil
}

// handOut writes up to capacity storages the engine freed to out as
// (storage-root id, action) pairs and returns how many.
func (d *dtrHandle) handOut(out []C.int64_t, capacity int64) int {
	if capacity <= 0 || d.eng.Pending() == 0 {
		return 0
	}
	if cap(d.buf) < int(capacity) {
		d.buf = make([]evict.Victim, capacity)
	}
	k := d.eng.HandOutPending(d.buf[:capacity])
	for i, v := range d.buf[:k] {
		out[2*i] = C.int64_t(v.Tensor)
		out[2*i+1] = C.int64_t(v.Action)
	}
	return k
}

//export memscale_go_dtr_op
func memscale_go_dtr_op(h C.int64_t, name *C.char, frame *C.int64_t) C.int64_t {
	op := int64(-1)
	withEngine("memscale_dtr_op", h, func(d *dtrHandle) error {
		var err error
		op, err = d.op(name, frame)
		return err
	})
	return C.int64_t(op)
}

//export memscale_go_dtr_mutate
func memscale_go_dtr_mutate(h C.int64_t, name *C.char, inputs *C.int64_t, nIn C.int32_t,
	mutated *C.int32_t, nMut C.int32_t, costNS C.int64_t, flags C.int32_t, outIDs *C.int64_t) C.int64_t {
	op := int64(-1)
	withEngine("memscale_dtr_mutate", h, func(d *dtrHandle) error {
		c, err := newOpCall(inputs, nIn, costNS, flags, outIDs, nMut)
		if err != nil {
			return err
		}
		muts, err := cArray(mutated, nMut, "mutated")
		if err != nil {
			return err
		}
		idx := make([]int, len(muts))
		for i, m := range muts {
			idx[i] = int(m)
		}
		op, err = c.run(d.eng, func() (rc.OpID, []rc.TensorID, error) {
			return d.eng.Mutate(opName(name), c.ins, idx, c.cost, c.flags)
		})
		return err
	})
	return C.int64_t(op)
}

// tensorCall wraps the int-returning per-tensor calls.
func tensorCall(name string, h, t C.int64_t, fn func(e *evict.Engine, t rc.TensorID) error) C.int {
	if withEngine(name, h, func(d *dtrHandle) error { return fn(d.eng, rc.TensorID(t)) }) {
		return -1
	}
	return 0
}

//export memscale_go_dtr_access
func memscale_go_dtr_access(h, t C.int64_t) C.int {
	return tensorCall("memscale_dtr_access", h, t, (*evict.Engine).Access)
}

//export memscale_go_dtr_lock
func memscale_go_dtr_lock(h, t C.int64_t) C.int {
	return tensorCall("memscale_dtr_lock", h, t, (*evict.Engine).Lock)
}

//export memscale_go_dtr_unlock
func memscale_go_dtr_unlock(h, t C.int64_t) C.int {
	return tensorCall("memscale_dtr_unlock", h, t, (*evict.Engine).Unlock)
}

//export memscale_go_dtr_pin
func memscale_go_dtr_pin(h, t C.int64_t) C.int {
	return tensorCall("memscale_dtr_pin", h, t, (*evict.Engine).Pin)
}

//export memscale_go_dtr_release
func memscale_go_dtr_release(h, t C.int64_t) C.int {
	return tensorCall("memscale_dtr_release", h, t, (*evict.Engine).Release)
}

//export memscale_go_dtr_swapped_in
func memscale_go_dtr_swapped_in(h, t C.int64_t) C.int {
	return tensorCall("memscale_dtr_swapped_in", h, t, (*evict.Engine).SwappedIn)
}

// byteArg is a byte count argument of a call: its name and value, and what
// it means (for the error when it is negative).
type byteArg struct {
	name  string
	value C.int64_t
	means string
}

// victimCall is memscale_dtr_evict and memscale_dtr_reclaim: it checks that
// bytes is >= 0, runs fn (the engine's Evict or Reclaim) with bytes and room
// for capacity victims, and writes the victims it returns to ids and
// actions. It returns their count, or -1.
func victimCall(name string, h C.int64_t, bytes byteArg, ids *C.int64_t, actions *C.int32_t, capacity C.int32_t,
	fn func(d *dtrHandle, bytes uint64, out []evict.Victim) (int, error)) C.int32_t {
	n := int32(-1)
	withEngine(name, h, func(d *dtrHandle) error {
		if bytes.value < 0 {
			return fmt.Errorf("%s %d: want %s, >= 0", bytes.name, int64(bytes.value), bytes.means)
		}
		if capacity <= 0 {
			return fmt.Errorf("cap %d: want > 0", int32(capacity))
		}
		outIDs, err := cArray(ids, capacity, "ids")
		if err != nil {
			return err
		}
		outActs, err := cArray(actions, capacity, "actions")
		if err != nil {
			return err
		}
		if cap(d.buf) < int(capacity) {
			d.buf = make([]evict.Victim, capacity)
		}
		buf := d.buf[:capacity]
		k, err := fn(d, uint64(bytes.value), buf)
		if err != nil {
			return err
		}
		for i, v := range buf[:k] {
			outIDs[i] = C.int64_t(v.Tensor)
			outActs[i] = C.int32_t(v.Action)
		}
		n = int32(k)
		return nil
	})
	return C.int32_t(n)
}

//export memscale_go_dtr_evict
func memscale_go_dtr_evict(h C.int64_t, extra C.int64_t, ids *C.int64_t, actions *C.int32_t, capacity C.int32_t) C.int32_t {
	return victimCall("memscale_dtr_evict", h, byteArg{"extra", extra, "the bytes about to be allocated"}, ids, actions, capacity,
		func(d *dtrHandle, extra uint64, out []evict.Victim) (int, error) { return d.eng.Evict(extra, out) })
}

// memscale_go_dtr_reclaim evicts victims whatever the budget until they
// free need bytes (evict.Engine.Reclaim); a shortfall is recorded for the
// out-of-memory message of memscale_malloc, not reported as an error.
//
//export memscale_go_dtr_reclaim
func memscale_go_dtr_reclaim(h C.int64_t, need C.int64_t, ids *C.int64_t, actions *C.int32_t, capacity C.int32_t) C.int32_t {
	return victimCall("memscale_dtr_reclaim", h, byteArg{"need", need, "the bytes the allocation is short of"}, ids, actions, capacity,
		func(d *dtrHandle, need uint64, out []evict.Victim) (int, error) {
			k, err := d.eng.Reclaim(need, out)
			if why := d.eng.ReclaimShortfall(); err == nil && why != "" {
				recordShortfall(int64(h), why)
			}
			return k, err
		})
}

//export memscale_go_dtr_plan
func memscale_go_dtr_plan(h C.int64_t, t C.int64_t, kinds *C.int32_t, ids *C.int64_t, capacity C.int32_t) C.int32_t {
	n := int32(-1)
	withEngine("memscale_dtr_plan", h, func(d *dtrHandle) error {
		steps, err := d.eng.Plan(rc.TensorID(t), d.pl[:0])
		d.pl = steps[:0]
		if err != nil {
			return err
		}
		if capacity < 0 {
			return fmt.Errorf("cap %d: want >= 0 (0 asks for the number of steps)", int32(capacity))
		}
		if len(steps) > int(capacity) {
			// as snprintf: the count, nothing written or held
			n = int32(len(steps))
			return nil
		}
		outKinds, err := cArray(kinds, C.int32_t(len(steps)), "kinds")
		if err != nil {
			return err
		}
		outIDs, err := cArray(ids, C.int32_t(len(steps)), "ids")
		if err != nil {
			return err
		}
		if err := d.eng.HoldPlan(steps); err != nil {
			return err
		}
		for i, st := range steps {
			outKinds[i] = C.int32_t(st.Kind)
			if st.Kind == rc.StepRerun {
				outIDs[i] = C.int64_t(st.Op)
			} else {
				outIDs[i] = C.int64_t(st.Tensor)
			}
		}
		n = int32(len(steps))
		return nil
	})
	return C.int32_t(n)
}

// memscale_go_dtr_abandon_plans forgets every plan memscale_dtr_plan
// committed and not run to the end (evict.Engine.AbandonPlans): their locks
// and soft holds go, as for a caller that stops running them (a rebuild
// failed and will be tried again from the start, or the step's error goes to
// the program). It returns how many there were.
//
//export memscale_go_dtr_abandon_plans
func memscale_go_dtr_abandon_plans(h C.int64_t) C.int {
	n := C.int(-1)
	withEngine("memscale_dtr_abandon_plans", h, func(d *dtrHandle) error {
		open := d.eng.PlanHolds()
		if err := d.eng.AbandonPlans(); err != nil {
			return err
		}
		n = C.int(open)
		return nil
	})
	return n
}

// memscale_go_dtr_park parks the storage of t in host memory although it
// may be locked (evict.Engine.Park): 1 parked, 0 not, -1 on error.
//
//export memscale_go_dtr_park
func memscale_go_dtr_park(h C.int64_t, t C.int64_t) C.int {
	n := C.int(-1)
	withEngine("memscale_dtr_park", h, func(d *dtrHandle) error {
		parked, err := d.eng.Park(rc.TensorID(t))
		if err != nil {
			return err
		}
		n = 0
		if parked {
			n = 1
		}
		return nil
	})
	return n
}

//export memscale_go_dtr_rematerialized
func memscale_go_dtr_rematerialized(h C.int64_t, op C.int64_t, costNS C.int64_t) C.int {
	if withEngine("memscale_dtr_rematerialized", h, func(d *dtrHandle) error {
		if costNS < 0 {
			return fmt.Errorf("cost_ns %d: want >= 0", int64(costNS))
		}
		return d.eng.Rematerialized(rc.OpID(op), int64(costNS))
	}) {
		return -1
	}
	return 0
}

//export memscale_go_dtr_finish
func memscale_go_dtr_finish(h C.int64_t) C.int {
	if withEngine("memscale_dtr_finish", h, func(d *dtrHandle) error {
		d.eng.Finish()
		d.searchLeast()
		return nil
	}) {
		return -1
	}
	return 0
}

//export memscale_go_dtr_status_of
func memscale_go_dtr_status_of(h C.int64_t) *C.memscale_dtr_status {
	var out *C.memscale_dtr_status
	withEngine("memscale_dtr_status_of", h, func(d *dtrHandle) error {
		out = d.status
		return nil
	})
	return out
}

// dtrStats is the JSON of memscale_dtr_stats_json: the engine's counters
// and the configuration it runs with, as memscale_dtr_create's keys.
type dtrStats struct {
	evict.Stats
	Config map[string]any `json:"config"`
	Least  *leastStats    `json:"least_budget,omitempty"`
}

//export memscale_go_dtr_stats_json
func memscale_go_dtr_stats_json(h C.int64_t) *C.char {
	var out *C.char
	withEngine("memscale_dtr_stats_json", h, func(d *dtrHandle) error {
		b, err := json.Marshal(dtrStats{Stats: d.eng.Stats(), Config: d.eng.Config().JSON(d.src), Least: d.least})
		if err != nil {
			return fmt.Errorf("encoding stats: %w", err)
		}
		out = cString(string(b))
		return nil
	})
	return out
}

// tuneReport is the JSON memscale_dtr_tune returns.
type tuneReport struct {
	Config          map[string]any `json:"config"`
	Choice          string         `json:"choice"`
	Feasible        bool           `json:"feasible"`
	Overhead        float64        `json:"overhead"`
	DefaultOverhead float64        `json:"default_overhead"`
	Budget          uint64         `json:"budget"`
	Instructions    int            `json:"instructions"`
	WallNS          int64          `json:"wall_ns"`
	Trials          []tuneTrial    `json:"trials"`
}

type tuneTrial struct {
	Candidate string  `json:"candidate"`
	Status    string  `json:"status"`
	Overhead  float64 `json:"overhead"`
}

// tune replays the engine's recording under its budget with every
// candidate of autotune.EngineCandidates and reports the choice.
func tune(eng *evict.Engine) (tuneReport, error) {
	tr, err := eng.Recording()
	if err != nil {
		return tuneReport{}, err
	}
	base := eng.Config()
	base.Usage, base.OnEvict, base.Record = nil, nil, false
	rep, err := autotune.Tune(tr, autotune.Options{Budget: eng.Budget(), Base: base, Plans: true,
		Candidates: autotune.EngineCandidates()})
	if err != nil {
		return tuneReport{}, err
	}
	out := tuneReport{
		Config: rep.Best.ConfigJSON(), Choice: rep.Best.String(), Feasible: rep.Feasible, Overhead: rep.Overhead(),
		Budget: eng.Budget(), Instructions: rep.Instructions, WallNS: rep.Wall.Nanoseconds(),
	}
	if first := rep.Trials[0].Result; first.Feasible() {
		out.DefaultOverhead = first.Overhead
	}
	for _, t := range rep.Trials {
		out.Trials = append(out.Trials, tuneTrial{Candidate: t.Candidate.String(), Status: t.Result.Status.String(), Overhead: t.Result.Overhead})
	}
	return out, nil
}

//export memscale_go_dtr_tune
func memscale_go_dtr_tune(h C.int64_t) *C.char {
	var out *C.char
	withEngine("memscale_dtr_tune", h, func(d *dtrHandle) error {
		rep, err := tune(d.eng)
		if err != nil {
			return err
		}
		b, err := json.Marshal(rep)
		if err != nil {
			return fmt.Errorf("encoding the tuning report: %w", err)
		}
		out = cString(string(b))
		return nil
	})
	return out
}
