//go:build linux

// Package sim emulates a GPU in host memory with the virtual-memory semantics of
// the CUDA driver, so the allocator and the engine run and are tested on a
// machine without a GPU.
//
// ReserveAddress maps inaccessible address space (mmap PROT_NONE);
// CreatePhysical takes a range of pages of one anonymous memory file (memfd);
// Map maps those pages read-write at a fixed address inside a reservation
// (MAP_FIXED|MAP_SHARED); Unmap puts PROT_NONE back, so touching unmapped or
// freed device memory faults just as a GPU raises an illegal-address error.
// Physical memory counts against a capacity (the simulated card size). Copies
// between "device" and host memory really move the bytes and can be slowed to
// a modeled bandwidth. Events complete at once unless their stream was marked
// busy with SetStreamBusy. CheckStream checks streams as a driver checks
// them: only the default streams (0, 1 and 2) and streams made by
// CreateStream (from C, memscale_sim_stream_create) are accepted. Fault injection fails the Nth Map or the Nth
// allocation (CreatePhysical or Alloc).
//
// All physical memory of a Device lives in a single memfd, so a Device holds
// one file descriptor however many chunks it creates; released chunks give
// their pages back to the system at once (hole punching).
package sim

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/memscale/memscale/device"
)

// DefaultCapacity is the simulated card size used when Config.Capacity is 0.
const DefaultCapacity uint64 = 16 << 30

// DefaultGranularity is the physical allocation granularity used when
// Config.Granularity is 0; it matches current NVIDIA GPUs.
const DefaultGranularity uint64 = 2 << 20

// Name is the device name reported by Info.
const Name = "memscale sim"

// ErrClosed is wrapped by every error from a Device after Close.
var ErrClosed = errors.New("sim: device closed")

// ErrInjected is wrapped by the errors of calls failed by fault injection.
var ErrInjected = errors.New("sim: injected fault")

// ErrInvalid is wrapped by errors that report a bad argument (a size that is
// not a multiple of the granularity, an unknown handle, an address outside a
// reservation, ...).
var ErrInvalid = errors.New("invalid argument")

// Config describes a simulated card.
type Config struct {
	// Capacity is the device memory size in bytes; 0 means DefaultCapacity.
	Capacity uint64
	// Granularity is the physical allocation granularity in bytes; 0 means
	// DefaultGranularity. It must be a multiple of the OS page size.
	Granularity uint64
	// CopyBandwidth models host<->device copies in bytes per second: a copy of
	// n bytes takes at least n/CopyBandwidth seconds. 0 means instant.
	CopyBandwidth float64
	// ModelOnly accounts the modeled copy time (see ModeledCopyTime) without
	// sleeping for it.
	ModelOnly bool
	// FailMapAt makes the FailMapAt-th call of Map (counting from 1) fail with
	// an error wrapping ErrInjected. 0 means never.
	FailMapAt int
	// FailAllocAt makes the FailAllocAt-th allocation call (CreatePhysical and
	// Alloc share one count, from 1) fail with an error wrapping ErrInjected
	// and a *device.OutOfMemoryError. 0 means never.
	FailAllocAt int
}

// withDefaults validates c and fills in the defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Capacity == 0 {
		c.Capacity = DefaultCapacity
	}
	if c.Granularity == 0 {
		c.Granularity = DefaultGranularity
	}
	page := uint64(os.Getpagesize())
	if c.Granularity%page != 0 {
		return c, fmt.Errorf("sim: Granularity %d is not a multiple of the page size %d: %w", c.Granularity, page, ErrInvalid)
	}
	if math.IsNaN(c.CopyBandwidth) || math.IsInf(c.CopyBandwidth, 0) || c.CopyBandwidth < 0 {
		return c, fmt.Errorf("sim: CopyBandwidth %v must be a finite number >= 0 (bytes/s, 0 = instant): %w", c.CopyBandwidth, ErrInvalid)
	}
	if c.FailMapAt < 0 {
		return c, fmt.Errorf("sim: FailMapAt %d must be >= 0 (0 = never): %w", c.FailMapAt, ErrInvalid)
	}
	if c.FailAllocAt < 0 {
		return c, fmt.Errorf("sim: FailAllocAt %d must be >= 0 (0 = never): %w", c.FailAllocAt, ErrInvalid)
	}
	return c, nil
}

// reservation is a range from ReserveAddress.
type reservation struct {
	base   device.Ptr
	size   uint64
	mapped uint64 // bytes mapped inside
}

// physical is a chunk from CreatePhysical: pages [off, off+size) of the memfd.
type physical struct {
	off  int64
	size uint64
	maps int // live mappings of this chunk
}

// mapping is one Map call's mapping.
type mapping struct {
	addr device.Ptr
	size uint64
	h    device.Handle
	res  *reservation
}

// allocation is one Alloc call's memory.
type allocation struct {
	size uint64
	h    device.Handle
}

// span is a free range of the memfd.
type span struct {
	off  int64
	size uint64
}

// event is an event from CreateEvent.
type event struct {
	recorded bool
	stream   device.Stream
	epoch    uint64
}

// stream is the busy state of one stream.
type stream struct {
	busy  bool
	epoch uint64 // incremented each time the stream becomes busy
}

// Device is a simulated GPU. It is safe for concurrent use.
type Device struct {
	cfg Config

	mu   sync.RWMutex
	cond *sync.Cond // signalled (with mu held for writing) when a stream goes idle or on Close

	closed bool
	fd     int   // the memfd holding all physical memory
	fileSz int64 // current size of the memfd
	free   []span

	created uint64 // physical bytes created and not released

	reservations map[device.Ptr]*reservation
	bases        []device.Ptr // sorted reservation bases
	handles      map[device.Handle]*physical
	nextHandle   device.Handle
	mappings     map[device.Ptr]*mapping    // by start address
	granules     map[device.Ptr]*mapping    // every mapped granule -> its mapping
	allocs       map[device.Ptr]*allocation // Alloc fallback
	hostAllocs   map[uintptr]uint64

	events     map[device.Event]*event
	nextEvent  device.Event
	streams    map[device.Stream]*stream
	made       map[device.Stream]bool // streams from CreateStream, not destroyed
	nextStream device.Stream

	mapCalls   int
	allocCalls int
	failMapAt  int
	failAlloc  int

	copiedBytes atomic.Uint64
	modeledNs   atomic.Int64
}

// New creates a simulated device.
func New(cfg Config) (*Device, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	fd, err := memfdCreate("memscale-sim")
	if err != nil {
		return nil, fmt.Errorf("sim: memfd_create: %w", err)
	}
	d := &Device{
		cfg:          cfg,
		fd:           fd,
		reservations: make(map[device.Ptr]*reservation),
		handles:      make(map[device.Handle]*physical),
		mappings:     make(map[device.Ptr]*mapping),
		granules:     make(map[device.Ptr]*mapping),
		allocs:       make(map[device.Ptr]*allocation),
		hostAllocs:   make(map[uintptr]uint64),
		events:       make(map[device.Event]*event),
		streams:      make(map[device.Stream]*stream),
		made:         make(map[device.Stream]bool),
		failMapAt:    cfg.FailMapAt,
		failAlloc:    cfg.FailAllocAt,
	}
	d.cond = sync.NewCond(&d.mu)
	return d, nil
}

// Config returns the effective configuration (defaults filled in).
func (d *Device) Config() Config { return d.cfg }

// Info describes the simulated device.
func (d *Device) Info() device.Info {
	return device.Info{
		Backend:     "sim",
		Ordinal:     0,
		Name:        Name,
		TotalMemory: d.cfg.Capacity,
		Granularity: d.cfg.Granularity,
		VMM:         true,
	}
}

// MemInfo returns the capacity not taken by physical memory, and the capacity.
func (d *Device) MemInfo() (free, total uint64, err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return 0, 0, fmt.Errorf("sim: MemInfo: %w", ErrClosed)
	}
	return d.cfg.Capacity - d.created, d.cfg.Capacity, nil
}

// Mapped returns the physical bytes created (by CreatePhysical or Alloc) and
// not yet released.
func (d *Device) Mapped() uint64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.created
}

// InjectFaults re-arms fault injection: the mapAt-th Map and the allocAt-th
// allocation call from now on fail (0 = never), as Config.FailMapAt and
// Config.FailAllocAt do from New.
func (d *Device) InjectFaults(mapAt, allocAt int) error {
	if mapAt < 0 || allocAt < 0 {
		return fmt.Errorf("sim: InjectFaults(%d, %d): counts must be >= 0 (0 = never): %w", mapAt, allocAt, ErrInvalid)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mapCalls, d.allocCalls = 0, 0
	d.failMapAt, d.failAlloc = mapAt, allocAt
	return nil
}

// CopiedBytes returns the bytes moved by CopyToHost and CopyToDevice so far.
func (d *Device) CopiedBytes() uint64 { return d.copiedBytes.Load() }

// ModeledCopyTime returns the total time the copies so far take under the
// bandwidth model (0 when Config.CopyBandwidth is 0).
func (d *Device) ModeledCopyTime() time.Duration { return time.Duration(d.modeledNs.Load()) }

// Close unmaps and frees everything the device holds: reservations, physical
// memory, Alloc and AllocHost memory, events. Waiters on busy streams return
// ErrClosed. Calling Close again does nothing.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	d.cond.Broadcast()
	var errs []error
	for base, r := range d.reservations {
		if err := munmap(uintptr(base), r.size); err != nil {
			errs = append(errs, fmt.Errorf("munmap reservation %#x: %w", base, err))
		}
	}
	for p, n := range d.hostAllocs {
		if err := munmap(p, n); err != nil {
			errs = append(errs, fmt.Errorf("munmap host memory %#x: %w", p, err))
		}
	}
	if err := syscall.Close(d.fd); err != nil {
		errs = append(errs, fmt.Errorf("close memfd: %w", err))
	}
	d.reservations, d.bases, d.handles, d.mappings, d.granules = nil, nil, nil, nil, nil
	d.allocs, d.hostAllocs, d.events, d.streams, d.made, d.free = nil, nil, nil, nil, nil, nil
	d.created = 0
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sim: Close: %w", err)
	}
	return nil
}

// checkSize validates a size passed to a VMM call.
func (d *Device) checkSize(op string, size uint64) error {
	if size == 0 {
		return fmt.Errorf("sim: %s: size is 0: %w", op, ErrInvalid)
	}
	if size%d.cfg.Granularity != 0 {
		return fmt.Errorf("sim: %s: size %d is not a multiple of the granularity %d: %w", op, size, d.cfg.Granularity, ErrInvalid)
	}
	return nil
}

// reservationOf returns the reservation holding [p, p+size), or nil.
func (d *Device) reservationOf(p device.Ptr, size uint64) *reservation {
	i := sort.Search(len(d.bases), func(i int) bool { return d.bases[i] > p }) - 1
	if i < 0 {
		return nil
	}
	r := d.reservations[d.bases[i]]
	if uint64(p-r.base)+size > r.size {
		return nil
	}
	return r
}

// ReserveAddress reserves size bytes of inaccessible address space, aligned to
// the granularity.
func (d *Device) ReserveAddress(size uint64) (device.Ptr, error) {
	if err := d.checkSize("ReserveAddress", size); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fmt.Errorf("sim: ReserveAddress: %w", ErrClosed)
	}
	p, err := d.reserveLocked(size)
	if err != nil {
		return 0, fmt.Errorf("sim: ReserveAddress(%d): %w", size, err)
	}
	return p, nil
}

// reserveLocked maps an aligned PROT_NONE range and records it.
func (d *Device) reserveLocked(size uint64) (device.Ptr, error) {
	g := d.cfg.Granularity
	raw, err := reserveNone(0, size+g, false)
	if err != nil {
		return 0, fmt.Errorf("mmap PROT_NONE %d bytes: %w", size+g, err)
	}
	base := raw + (uintptr(g)-raw%uintptr(g))%uintptr(g)
	if head := uint64(base - raw); head > 0 {
		if err := munmap(raw, head); err != nil {
			return 0, fmt.Errorf("munmap alignment head: %w", err)
		}
	}
	if tail := g - uint64(base-raw); tail > 0 {
		if err := munmap(base+uintptr(size), tail); err != nil {
			return 0, fmt.Errorf("munmap alignment tail: %w", err)
		}
	}
	p := device.Ptr(base)
	d.reservations[p] = &reservation{base: p, size: size}
	i := sort.Search(len(d.bases), func(i int) bool { return d.bases[i] > p })
	d.bases = append(d.bases, 0)
	copy(d.bases[i+1:], d.bases[i:])
	d.bases[i] = p
	return p, nil
}

// FreeAddress returns a reservation; nothing in it may still be mapped.
func (d *Device) FreeAddress(base device.Ptr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("sim: FreeAddress: %w", ErrClosed)
	}
	return d.freeAddressLocked(base, size)
}

func (d *Device) freeAddressLocked(base device.Ptr, size uint64) error {
	r, ok := d.reservations[base]
	if !ok {
		return fmt.Errorf("sim: FreeAddress(%#x): not the base of a reserved range: %w", base, ErrInvalid)
	}
	if size != r.size {
		return fmt.Errorf("sim: FreeAddress(%#x, %d): the range was reserved with size %d: %w", base, size, r.size, ErrInvalid)
	}
	if r.mapped != 0 {
		return fmt.Errorf("sim: FreeAddress(%#x): %d bytes are still mapped in it: %w", base, r.mapped, ErrInvalid)
	}
	if err := munmap(uintptr(base), size); err != nil {
		return fmt.Errorf("sim: FreeAddress(%#x): munmap: %w", base, err)
	}
	delete(d.reservations, base)
	i := sort.Search(len(d.bases), func(i int) bool { return d.bases[i] >= base })
	d.bases = append(d.bases[:i], d.bases[i+1:]...)
	return nil
}

// allocFault counts an allocation call and reports whether it must fail.
func (d *Device) allocFault() bool {
	d.allocCalls++
	return d.failAlloc > 0 && d.allocCalls == d.failAlloc
}

// CreatePhysical creates size bytes of physical memory (a multiple of the
// granularity) counted against the capacity.
func (d *Device) CreatePhysical(size uint64) (device.Handle, error) {
	if err := d.checkSize("CreatePhysical", size); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fmt.Errorf("sim: CreatePhysical: %w", ErrClosed)
	}
	if d.allocFault() {
		oom := &device.OutOfMemoryError{Op: "CreatePhysical", Requested: size, Free: d.cfg.Capacity - d.created}
		return 0, fmt.Errorf("sim: allocation call %d: %w: %w", d.allocCalls, ErrInjected, oom)
	}
	h, err := d.createLocked("CreatePhysical", size)
	if err != nil {
		return 0, err
	}
	return h, nil
}

// createLocked takes size bytes of the memfd for a new handle.
func (d *Device) createLocked(op string, size uint64) (device.Handle, error) {
	if size > d.cfg.Capacity-d.created {
		return 0, &device.OutOfMemoryError{Op: op, Requested: size, Free: d.cfg.Capacity - d.created}
	}
	off, err := d.takeSpan(size)
	if err != nil {
		return 0, fmt.Errorf("sim: %s(%d): %w", op, size, err)
	}
	d.nextHandle++
	h := d.nextHandle
	d.handles[h] = &physical{off: off, size: size}
	d.created += size
	return h, nil
}

// takeSpan finds size bytes of file space: the first free span that fits, or
// the end of the file, which grows.
func (d *Device) takeSpan(size uint64) (int64, error) {
	for i, s := range d.free {
		if s.size < size {
			continue
		}
		off := s.off
		if s.size == size {
			d.free = append(d.free[:i], d.free[i+1:]...)
		} else {
			d.free[i] = span{off: s.off + int64(size), size: s.size - size}
		}
		return off, nil
	}
	off := d.fileSz
	if err := syscall.Ftruncate(d.fd, off+int64(size)); err != nil {
		return 0, fmt.Errorf("grow memfd to %d bytes: %w", off+int64(size), err)
	}
	d.fileSz = off + int64(size)
	return off, nil
}

// giveSpan returns file space: its pages go back to the system, and the span
// joins the free list (or shrinks the file when it is at the end).
func (d *Device) giveSpan(off int64, size uint64) error {
	i := sort.Search(len(d.free), func(i int) bool { return d.free[i].off > off })
	s := span{off: off, size: size}
	// Merge with the neighbours.
	if i > 0 && d.free[i-1].off+int64(d.free[i-1].size) == s.off {
		s.off = d.free[i-1].off
		s.size += d.free[i-1].size
		d.free = append(d.free[:i-1], d.free[i:]...)
		i--
	}
	if i < len(d.free) && s.off+int64(s.size) == d.free[i].off {
		s.size += d.free[i].size
		d.free = append(d.free[:i], d.free[i+1:]...)
	}
	if s.off+int64(s.size) == d.fileSz {
		if err := syscall.Ftruncate(d.fd, s.off); err != nil {
			return fmt.Errorf("shrink memfd to %d bytes: %w", s.off, err)
		}
		d.fileSz = s.off
		return nil
	}
	if err := punchHole(d.fd, off, size); err != nil {
		return fmt.Errorf("punch hole [%d, +%d) in memfd: %w", off, size, err)
	}
	d.free = append(d.free, span{})
	copy(d.free[i+1:], d.free[i:])
	d.free[i] = s
	return nil
}

// ReleasePhysical frees physical memory that is no longer mapped.
func (d *Device) ReleasePhysical(h device.Handle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("sim: ReleasePhysical: %w", ErrClosed)
	}
	return d.releaseLocked(h)
}

func (d *Device) releaseLocked(h device.Handle) error {
	ph, ok := d.handles[h]
	if !ok {
		return fmt.Errorf("sim: ReleasePhysical(%d): unknown or already released handle: %w", h, ErrInvalid)
	}
	if ph.maps > 0 {
		return fmt.Errorf("sim: ReleasePhysical(%d): still mapped at %d place(s); Unmap first: %w", h, ph.maps, ErrInvalid)
	}
	if err := d.giveSpan(ph.off, ph.size); err != nil {
		return fmt.Errorf("sim: ReleasePhysical(%d): %w", h, err)
	}
	delete(d.handles, h)
	d.created -= ph.size
	return nil
}

// Map maps the whole of h (size bytes) read-write at addr, which must lie in a
// reservation, be aligned to the granularity and not be mapped already.
func (d *Device) Map(addr device.Ptr, size uint64, h device.Handle) error {
	if err := d.checkSize("Map", size); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("sim: Map: %w", ErrClosed)
	}
	d.mapCalls++
	if d.failMapAt > 0 && d.mapCalls == d.failMapAt {
		return fmt.Errorf("sim: Map(%#x, %d): map call %d: %w", addr, size, d.mapCalls, ErrInjected)
	}
	return d.mapLocked(addr, size, h)
}

// MapRange maps the handles hs (each of size each) one after another from
// addr; the sim grants access with the mapping. On failure the handles
// mapped so far are unmapped again.
func (d *Device) MapRange(addr device.Ptr, each uint64, hs []device.Handle) error {
	for i, h := range hs {
		if err := d.Map(addr+device.Ptr(uint64(i)*each), each, h); err != nil {
			if i > 0 {
				if uerr := d.Unmap(addr, uint64(i)*each); uerr != nil {
					return errors.Join(err, uerr)
				}
			}
			return err
		}
	}
	return nil
}

// CheckStream reports an error, wrapping ErrInvalid, when s is not a stream
// of this device: as a CUDA driver refuses a made-up handle, the sim accepts
// only the default streams (0, CU_STREAM_LEGACY 1, CU_STREAM_PER_THREAD 2)
// and streams from CreateStream not yet destroyed.
func (d *Device) CheckStream(s device.Stream) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return fmt.Errorf("sim: CheckStream: %w", ErrClosed)
	}
	return d.checkStreamLocked("CheckStream", s)
}

func (d *Device) mapLocked(addr device.Ptr, size uint64, h device.Handle) error {
	g := d.cfg.Granularity
	if uint64(addr)%g != 0 {
		return fmt.Errorf("sim: Map(%#x): address is not aligned to the granularity %d: %w", addr, g, ErrInvalid)
	}
	ph, ok := d.handles[h]
	if !ok {
		return fmt.Errorf("sim: Map(%#x, %d, %d): unknown or released handle: %w", addr, size, h, ErrInvalid)
	}
	if size != ph.size {
		return fmt.Errorf("sim: Map(%#x, %d, %d): the handle holds %d bytes and is mapped whole: %w", addr, size, h, ph.size, ErrInvalid)
	}
	r := d.reservationOf(addr, size)
	if r == nil {
		return fmt.Errorf("sim: Map(%#x, %d): range is not inside a reserved range: %w", addr, size, ErrInvalid)
	}
	for p := addr; p < addr+device.Ptr(size); p += device.Ptr(g) {
		if m, ok := d.granules[p]; ok {
			return fmt.Errorf("sim: Map(%#x, %d): %#x is already mapped (mapping at %#x, %d bytes): %w", addr, size, p, m.addr, m.size, ErrInvalid)
		}
	}
	_, err := mmap(uintptr(addr), size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_FIXED, d.fd, ph.off)
	if err != nil {
		return fmt.Errorf("sim: Map(%#x, %d): mmap memfd: %w", addr, size, err)
	}
	m := &mapping{addr: addr, size: size, h: h, res: r}
	d.mappings[addr] = m
	for p := addr; p < addr+device.Ptr(size); p += device.Ptr(g) {
		d.granules[p] = m
	}
	ph.maps++
	r.mapped += size
	return nil
}

// Unmap removes the mappings that exactly cover [addr, addr+size); one or more
// whole mappings, never part of one. The range becomes inaccessible again.
func (d *Device) Unmap(addr device.Ptr, size uint64) error {
	if err := d.checkSize("Unmap", size); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("sim: Unmap: %w", ErrClosed)
	}
	return d.unmapLocked(addr, size)
}

func (d *Device) unmapLocked(addr device.Ptr, size uint64) error {
	end := addr + device.Ptr(size)
	// Validate first so a bad call changes nothing.
	var ms []*mapping
	for p := addr; p < end; {
		m, ok := d.mappings[p]
		if !ok {
			if _, inside := d.granules[p]; inside {
				return fmt.Errorf("sim: Unmap(%#x, %d): %#x is in the middle of a mapping; unmap whole mappings: %w", addr, size, p, ErrInvalid)
			}
			return fmt.Errorf("sim: Unmap(%#x, %d): %#x is not mapped: %w", addr, size, p, ErrInvalid)
		}
		if p+device.Ptr(m.size) > end {
			return fmt.Errorf("sim: Unmap(%#x, %d): the mapping at %#x (%d bytes) extends past the range: %w", addr, size, p, m.size, ErrInvalid)
		}
		ms = append(ms, m)
		p += device.Ptr(m.size)
	}
	if _, err := reserveNone(uintptr(addr), size, true); err != nil {
		return fmt.Errorf("sim: Unmap(%#x, %d): mmap PROT_NONE: %w", addr, size, err)
	}
	g := device.Ptr(d.cfg.Granularity)
	for _, m := range ms {
		delete(d.mappings, m.addr)
		for p := m.addr; p < m.addr+device.Ptr(m.size); p += g {
			delete(d.granules, p)
		}
		d.handles[m.h].maps--
		m.res.mapped -= m.size
	}
	return nil
}

// Alloc is the non-VMM fallback: size bytes (rounded up to the granularity) of
// mapped memory, counted against the capacity. It counts as an allocation call
// for fault injection.
func (d *Device) Alloc(size uint64) (device.Ptr, error) {
	if size == 0 {
		return 0, fmt.Errorf("sim: Alloc: size is 0: %w", ErrInvalid)
	}
	g := d.cfg.Granularity
	if size > math.MaxUint64-g {
		return 0, &device.OutOfMemoryError{Op: "Alloc", Requested: size, Free: 0}
	}
	rounded := (size + g - 1) / g * g
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fmt.Errorf("sim: Alloc: %w", ErrClosed)
	}
	if d.allocFault() {
		oom := &device.OutOfMemoryError{Op: "Alloc", Requested: size, Free: d.cfg.Capacity - d.created}
		return 0, fmt.Errorf("sim: allocation call %d: %w: %w", d.allocCalls, ErrInjected, oom)
	}
	if rounded > d.cfg.Capacity-d.created {
		return 0, &device.OutOfMemoryError{Op: "Alloc", Requested: size, Free: d.cfg.Capacity - d.created}
	}
	p, err := d.reserveLocked(rounded)
	if err != nil {
		return 0, fmt.Errorf("sim: Alloc(%d): %w", size, err)
	}
	h, err := d.createLocked("Alloc", rounded)
	if err != nil {
		_ = d.freeAddressLocked(p, rounded)
		return 0, err
	}
	if err := d.mapLocked(p, rounded, h); err != nil {
		_ = d.releaseLocked(h)
		_ = d.freeAddressLocked(p, rounded)
		return 0, fmt.Errorf("sim: Alloc(%d): %w", size, err)
	}
	d.allocs[p] = &allocation{size: rounded, h: h}
	return p, nil
}

// Free releases memory obtained from Alloc.
func (d *Device) Free(p device.Ptr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("sim: Free: %w", ErrClosed)
	}
	a, ok := d.allocs[p]
	if !ok {
		return fmt.Errorf("sim: Free(%#x): not a live pointer from Alloc: %w", p, ErrInvalid)
	}
	if err := d.unmapLocked(p, a.size); err != nil {
		return fmt.Errorf("sim: Free(%#x): %w", p, err)
	}
	if err := d.releaseLocked(a.h); err != nil {
		return fmt.Errorf("sim: Free(%#x): %w", p, err)
	}
	if err := d.freeAddressLocked(p, a.size); err != nil {
		return fmt.Errorf("sim: Free(%#x): %w", p, err)
	}
	delete(d.allocs, p)
	return nil
}

// Compile-time check that Device implements device.Device.
var _ device.Device = (*Device)(nil)
