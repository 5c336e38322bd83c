package allocator

import (
	"errors"
	"fmt"
	"sync"

	"github.com/memscale/memscale/device"
)

// errWouldBlock is returned by the test devices' SynchronizeEvent for an
// event on a busy stream: a single-threaded test would otherwise hang.
var errWouldBlock = errors.New("test device: synchronizing would block: stream busy")

// fakeDevice implements device.Device with address bookkeeping only (no
// memory behind the addresses). It checks every call strictly, so allocator
// bugs (mapping twice, unmapping what is not mapped, releasing mapped memory,
// freeing an address range with mappings) surface as errors and in
// violations.
type fakeDevice struct {
	mu sync.Mutex

	capacity uint64
	gran     uint64
	vmm      bool

	nextVA     uint64
	ranges     map[device.Ptr]uint64 // reserved ranges
	pages      map[device.Ptr]device.Handle
	handles    map[device.Handle]*fakeHandle
	nextHandle device.Handle
	allocs     map[device.Ptr]uint64
	created    uint64

	events    map[device.Event]*fakeEvent
	nextEvent device.Event
	streams   map[device.Stream]*fakeStream

	// Counters for assertions. nMapRange and nUnmap count calls (one
	// access grant per MapRange); nMap counts handles mapped.
	nMap, nMapRange, nUnmap, nCreate, nRelease, nAlloc, nFree, nReserve, nSync int
	recorded                                                                   map[device.Stream]int // RecordEvent calls per stream

	// dead streams are refused by RecordEvent (destroyed external streams);
	// foreign streams by CheckStream (another device's).
	dead, foreign map[device.Stream]bool

	failCreateAt, failMapAt int // fault injection: fail the Nth call (0 = never)

	violations []string
}

type fakeHandle struct {
	size   uint64
	mapped bool
}

type fakeEvent struct {
	recorded bool
	stream   device.Stream
	epoch    uint64
}

type fakeStream struct {
	busy  bool
	epoch uint64
}

func newFakeDevice(capacity, gran uint64, vmm bool) *fakeDevice {
	return &fakeDevice{
		capacity: capacity,
		gran:     gran,
		vmm:      vmm,
		nextVA:   1 << 40,
		ranges:   make(map[device.Ptr]uint64),
		pages:    make(map[device.Ptr]device.Handle),
		handles:  make(map[device.Handle]*fakeHandle),
		allocs:   make(map[device.Ptr]uint64),
		events:   make(map[device.Event]*fakeEvent),
		streams:  make(map[device.Stream]*fakeStream),
		recorded: make(map[device.Stream]int),
		dead:     make(map[device.Stream]bool),
		foreign:  make(map[device.Stream]bool),
	}
}

func (d *fakeDevice) violate(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	d.violations = append(d.violations, msg)
	return errors.New("fake device: " + msg)
}

func (d *fakeDevice) Info() device.Info {
	return device.Info{Backend: "fake", Name: "fake", TotalMemory: d.capacity, Granularity: d.gran, VMM: d.vmm}
}

func (d *fakeDevice) MemInfo() (uint64, uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.capacity - d.created, d.capacity, nil
}

// Mapped returns the physical bytes created and not released.
func (d *fakeDevice) Mapped() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.created
}

// counts returns the number of calls that add memory (CreatePhysical, Map,
// Alloc), for the "reuse without new device memory" checks.
func (d *fakeDevice) counts() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.nCreate + d.nMap + d.nAlloc
}

func (d *fakeDevice) ReserveAddress(size uint64) (device.Ptr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if size == 0 || size%d.gran != 0 {
		return 0, d.violate("ReserveAddress(%d): not a multiple of %d", size, d.gran)
	}
	p := device.Ptr(d.nextVA)
	d.nextVA += size + d.gran // a guard gap between ranges
	d.ranges[p] = size
	d.nReserve++
	return p, nil
}

func (d *fakeDevice) FreeAddress(base device.Ptr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	sz, ok := d.ranges[base]
	if !ok || sz != size {
		return d.violate("FreeAddress(%#x, %d): not a reserved range", uintptr(base), size)
	}
	for p := base; p < base+device.Ptr(size); p += device.Ptr(d.gran) {
		if _, m := d.pages[p]; m {
			return d.violate("FreeAddress(%#x): %#x still mapped", uintptr(base), uintptr(p))
		}
	}
	delete(d.ranges, base)
	return nil
}

func (d *fakeDevice) CreatePhysical(size uint64) (device.Handle, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if size == 0 || size%d.gran != 0 {
		return 0, d.violate("CreatePhysical(%d): not a multiple of %d", size, d.gran)
	}
	d.nCreate++
	if d.failCreateAt > 0 && d.nCreate == d.failCreateAt {
		return 0, fmt.Errorf("fake: injected: %w", &device.OutOfMemoryError{Op: "CreatePhysical", Requested: size, Free: d.capacity - d.created})
	}
	if d.created+size > d.capacity {
		return 0, &device.OutOfMemoryError{Op: "CreatePhysical", Requested: size, Free: d.capacity - d.created}
	}
	d.nextHandle++
	d.handles[d.nextHandle] = &fakeHandle{size: size}
	d.created += size
	return d.nextHandle, nil
}

func (d *fakeDevice) ReleasePhysical(h device.Handle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ph, ok := d.handles[h]
	if !ok {
		return d.violate("ReleasePhysical(%d): unknown handle", h)
	}
	if ph.mapped {
		return d.violate("ReleasePhysical(%d): still mapped", h)
	}
	delete(d.handles, h)
	d.created -= ph.size
	d.nRelease++
	return nil
}

func (d *fakeDevice) inRange(p device.Ptr, size uint64) bool {
	for base, sz := range d.ranges {
		if p >= base && uint64(p-base)+size <= sz {
			return true
		}
	}
	return false
}

func (d *fakeDevice) Map(addr device.Ptr, size uint64, h device.Handle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ph, ok := d.handles[h]
	switch {
	case !ok:
		return d.violate("Map(%#x): unknown handle %d", uintptr(addr), h)
	case ph.mapped:
		return d.violate("Map(%#x): handle %d already mapped", uintptr(addr), h)
	case size != ph.size || uint64(addr)%d.gran != 0:
		return d.violate("Map(%#x, %d): bad size or alignment", uintptr(addr), size)
	case !d.inRange(addr, size):
		return d.violate("Map(%#x, %d): outside every reserved range", uintptr(addr), size)
	}
	for p := addr; p < addr+device.Ptr(size); p += device.Ptr(d.gran) {
		if _, m := d.pages[p]; m {
			return d.violate("Map(%#x): %#x already mapped", uintptr(addr), uintptr(p))
		}
	}
	d.nMap++
	if d.failMapAt > 0 && d.nMap == d.failMapAt {
		return errors.New("fake: injected Map failure")
	}
	for p := addr; p < addr+device.Ptr(size); p += device.Ptr(d.gran) {
		d.pages[p] = h
	}
	ph.mapped = true
	return nil
}

func (d *fakeDevice) MapRange(addr device.Ptr, each uint64, hs []device.Handle) error {
	d.mu.Lock()
	d.nMapRange++
	d.mu.Unlock()
	for i, h := range hs {
		if err := d.Map(addr+device.Ptr(uint64(i)*each), each, h); err != nil {
			if i > 0 {
				_ = d.Unmap(addr, uint64(i)*each)
			}
			return err
		}
	}
	return nil
}

func (d *fakeDevice) CheckStream(s device.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.foreign[s] {
		return fmt.Errorf("fake: stream %#x belongs to another device", uintptr(s))
	}
	return nil
}

func (d *fakeDevice) Unmap(addr device.Ptr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if size == 0 || size%d.gran != 0 {
		return d.violate("Unmap(%#x, %d): bad size", uintptr(addr), size)
	}
	for p := addr; p < addr+device.Ptr(size); p += device.Ptr(d.gran) {
		if _, m := d.pages[p]; !m {
			return d.violate("Unmap(%#x, %d): %#x not mapped", uintptr(addr), size, uintptr(p))
		}
	}
	for p := addr; p < addr+device.Ptr(size); p += device.Ptr(d.gran) {
		d.handles[d.pages[p]].mapped = false
		delete(d.pages, p)
	}
	d.nUnmap++
	return nil
}

func (d *fakeDevice) Alloc(size uint64) (device.Ptr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nAlloc++
	if d.failCreateAt > 0 && d.nAlloc == d.failCreateAt {
		return 0, fmt.Errorf("fake: injected: %w", &device.OutOfMemoryError{Op: "Alloc", Requested: size})
	}
	if d.created+size > d.capacity {
		return 0, &device.OutOfMemoryError{Op: "Alloc", Requested: size, Free: d.capacity - d.created}
	}
	p := device.Ptr(d.nextVA)
	d.nextVA += alignUp(size, d.gran) + d.gran
	d.allocs[p] = size
	d.created += size
	return p, nil
}

func (d *fakeDevice) Free(p device.Ptr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	size, ok := d.allocs[p]
	if !ok {
		return d.violate("Free(%#x): not allocated", uintptr(p))
	}
	delete(d.allocs, p)
	d.created -= size
	d.nFree++
	return nil
}

// SetStreamBusy has the sim's semantics: an event recorded while s is busy
// completes when s is next set idle.
func (d *fakeDevice) SetStreamBusy(s device.Stream, busy bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.streams[s]
	if st == nil {
		st = &fakeStream{}
		d.streams[s] = st
	}
	if busy && !st.busy {
		st.epoch++
	}
	st.busy = busy
}

func (d *fakeDevice) done(e *fakeEvent) bool {
	if !e.recorded {
		return true
	}
	st := d.streams[e.stream]
	return st == nil || !st.busy || st.epoch != e.epoch
}

func (d *fakeDevice) CreateEvent() (device.Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nextEvent++
	d.events[d.nextEvent] = &fakeEvent{}
	return d.nextEvent, nil
}

func (d *fakeDevice) RecordEvent(e device.Event, s device.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ev, ok := d.events[e]
	if !ok {
		return d.violate("RecordEvent(%d): unknown event", e)
	}
	d.recorded[s]++
	if d.dead[s] || d.foreign[s] {
		return fmt.Errorf("fake: RecordEvent on stream %#x: invalid resource handle", uintptr(s))
	}
	ev.recorded, ev.stream, ev.epoch = false, s, 0
	if st := d.streams[s]; st != nil && st.busy {
		ev.recorded, ev.epoch = true, st.epoch
	}
	return nil
}

func (d *fakeDevice) QueryEvent(e device.Event) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ev, ok := d.events[e]
	if !ok {
		return false, d.violate("QueryEvent(%d): unknown event", e)
	}
	return d.done(ev), nil
}

func (d *fakeDevice) SynchronizeEvent(e device.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ev, ok := d.events[e]
	if !ok {
		return d.violate("SynchronizeEvent(%d): unknown event", e)
	}
	if !d.done(ev) {
		return errWouldBlock
	}
	return nil
}

func (d *fakeDevice) DestroyEvent(e device.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.events[e]; !ok {
		return d.violate("DestroyEvent(%d): unknown event", e)
	}
	delete(d.events, e)
	return nil
}

func (d *fakeDevice) Synchronize() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nSync++
	for _, st := range d.streams {
		if st.busy {
			return errWouldBlock
		}
	}
	return nil
}

func (d *fakeDevice) AllocHost(uint64) (uintptr, error) {
	return 0, fmt.Errorf("fake: AllocHost: %w", device.ErrUnavailable)
}
func (d *fakeDevice) FreeHost(uintptr) error {
	return fmt.Errorf("fake: FreeHost: %w", device.ErrUnavailable)
}
func (d *fakeDevice) CopyToHost(uintptr, device.Ptr, uint64, device.Stream) error {
	return fmt.Errorf("fake: CopyToHost: %w", device.ErrUnavailable)
}
func (d *fakeDevice) CopyToDevice(device.Ptr, uintptr, uint64, device.Stream) error {
	return fmt.Errorf("fake: CopyToDevice: %w", device.ErrUnavailable)
}

func (d *fakeDevice) Close() error { return nil }

var _ device.Device = (*fakeDevice)(nil)
