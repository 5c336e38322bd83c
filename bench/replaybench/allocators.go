package replaybench

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/memscale/memscale/allocator"
	"github.com/memscale/memscale/bench/nativemodel"
	"github.com/memscale/memscale/device"
	"github.com/memscale/memscale/device/backend"
	"github.com/memscale/memscale/device/sim"
)

// Allocator is what the replay drives: memscale's allocator, the model of
// PyTorch's, or plain device allocation.
type Allocator interface {
	// Malloc allocates size bytes on stream (a dense stream index).
	Malloc(size uint64, stream int32) (uint64, error)
	// Free frees an address Malloc returned.
	Free(addr uint64) error
	// Reserved is the memory held from the device now.
	Reserved() uint64
	// Counters returns the peaks and device-allocation counts so far.
	Counters() Counters
	// SetLimit sets the memory limit in bytes; 0 lifts it.
	SetLimit(bytes uint64) error
	// Close releases everything.
	Close() error
}

// Counters are an allocator's totals.
type Counters struct {
	// PeakAllocated is the peak of bytes in allocated blocks (after rounding).
	PeakAllocated uint64
	// PeakReserved is the peak of bytes held from the device.
	PeakReserved uint64
	// DeviceAllocs counts physical allocations from the device: cudaMalloc
	// calls, or chunks/granules created for virtual-memory segments.
	DeviceAllocs int64
	// Mapping says whether Maps, Unmaps and Remaps are counted (memscale's
	// allocator with expandable segments).
	Mapping bool
	// Maps, Unmaps and Remaps are the granules mapped, unmapped, and moved
	// from cached free memory to where a request needed them (num_map,
	// num_unmap, num_remap).
	Maps, Unmaps, Remaps int64
}

// Backend is where memscale's allocator and plain device allocation run.
type Backend string

// The backends.
const (
	// BackendSim is the simulated device (device/sim): no GPU needed.
	BackendSim Backend = "sim"
	// BackendCUDA is the first GPU through the CUDA driver (device/cuda).
	BackendCUDA Backend = "cuda"
)

// Env is what building an allocator needs.
type Env struct {
	// Backend is sim or cuda.
	Backend Backend
	// Capacity is the simulated card's size (sim only).
	Capacity uint64
	// Limit is the memory limit in bytes (0 = none).
	Limit uint64
}

// Spec names one allocator configuration.
type Spec struct {
	// Name is the column or row name ("memscale", "torch-expandable").
	Name string
	// Describe says what it is, for the report.
	Describe string
	// New builds a fresh allocator.
	New func(env Env) (Allocator, error)
}

// memscaleVariants are the memscale configurations a user can set.
var memscaleVariants = []struct {
	name, desc string
	cfg        allocator.Config
}{
	{"memscale", "memscale default (expandable segments, CacheSlack 0: cached granules are remapped before new ones are created)", allocator.Config{}},
	{"memscale-slack5", "memscale, CacheSlack 0.05 (MEMSCALE_CACHE_SLACK)", allocator.Config{CacheSlack: 0.05}},
	{"memscale-noremap", "memscale, CacheSlack -1 (no remapping below the limit, as PyTorch's expandable segments)", allocator.Config{CacheSlack: -1}},
	{"memscale-novmm", "memscale without VMM (Device.Alloc segments sized as PyTorch's)", allocator.Config{DisableVMM: true}},
}

// Names lists the allocator names Lookup knows, in report order.
func Names() []string {
	var out []string
	for _, v := range memscaleVariants {
		out = append(out, v.name)
	}
	return append(out, "torch", "torch-expandable", "torch[CONF]", "cuda-malloc")
}

// DefaultNames are the allocators replayed when none is named.
var DefaultNames = []string{"memscale", "torch", "torch-expandable"}

// Lookup returns the spec of a name: a memscale variant, "torch" (the model
// of PyTorch's allocator, default configuration), "torch-expandable"
// (expandable_segments:True), "torch[CONF]" (CONF in PYTORCH_CUDA_ALLOC_CONF
// syntax) or "cuda-malloc" (every request a device allocation; cuda backend).
func Lookup(name string) (Spec, error) {
	for _, v := range memscaleVariants {
		if v.name == name {
			cfg := v.cfg
			return Spec{Name: v.name, Describe: v.desc, New: func(env Env) (Allocator, error) { return newMemscale(env, cfg) }}, nil
		}
	}
	switch {
	case name == "torch":
		return torchSpec(name, "")
	case name == "torch-expandable":
		return torchSpec(name, "expandable_segments:True")
	case strings.HasPrefix(name, "torch[") && strings.HasSuffix(name, "]"):
		return torchSpec(name, name[len("torch["):len(name)-1])
	case name == "cuda-malloc":
		return Spec{Name: name, Describe: "cuMemAlloc/cuMemFree for every request (no caching)", New: newDeviceAlloc}, nil
	}
	known := Names()
	sort.Strings(known)
	return Spec{}, fmt.Errorf("unknown allocator %q (known: %s)", name, strings.Join(known, ", "))
}

func torchSpec(name, conf string) (Spec, error) {
	cfg, err := nativemodel.ParseConf(conf)
	if err != nil {
		return Spec{}, fmt.Errorf("allocator %s: %w", name, err)
	}
	desc := "model of PyTorch's native caching allocator, default configuration"
	if conf != "" {
		desc = "model of PyTorch's native caching allocator, PYTORCH_CUDA_ALLOC_CONF=" + cfg.String()
	}
	return Spec{Name: name, Describe: desc, New: func(env Env) (Allocator, error) {
		c := cfg
		c.Capacity = env.Limit
		return &torchModel{m: nativemodel.New(c)}, nil
	}}, nil
}

// torchModel adapts nativemodel.Model.
type torchModel struct{ m *nativemodel.Model }

func (t *torchModel) Malloc(size uint64, stream int32) (uint64, error) {
	return t.m.Malloc(size, stream)
}
func (t *torchModel) Free(addr uint64) error  { return t.m.Free(addr) }
func (t *torchModel) Reserved() uint64        { return t.m.Stats().Reserved }
func (t *torchModel) SetLimit(b uint64) error { t.m.SetCapacity(b); return nil }
func (t *torchModel) Close() error            { return nil }
func (t *torchModel) Counters() Counters {
	s := t.m.Stats()
	n := s.NumDeviceAlloc
	if t.m.Config().ExpandableSegments {
		n = s.ChunksMapped
	}
	return Counters{PeakAllocated: s.PeakAllocated, PeakReserved: s.PeakReserved, DeviceAllocs: n}
}

// openDevice opens the backend's device.
func openDevice(env Env) (device.Device, error) {
	switch env.Backend {
	case BackendSim, "":
		return backend.Open(backend.Sim, 0, sim.Config{Capacity: env.Capacity}, nil)
	case BackendCUDA:
		d, err := backend.Open(backend.CUDA, 0, sim.Config{}, nil)
		if err != nil {
			return nil, fmt.Errorf("--backend cuda needs an NVIDIA GPU and its driver (libcuda.so.1): %w", err)
		}
		return d, nil
	}
	return nil, fmt.Errorf("unknown backend %q (sim or cuda)", env.Backend)
}

// memscaleAlloc adapts allocator.Allocator on a device of its own.
type memscaleAlloc struct {
	dev     device.Device
	a       *allocator.Allocator
	streams []device.Stream
	cuda    bool
}

func newMemscale(env Env, cfg allocator.Config) (Allocator, error) {
	d, err := openDevice(env)
	if err != nil {
		return nil, err
	}
	cfg.Device = d
	cfg.Limit = env.Limit
	a, err := allocator.New(cfg)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("memscale allocator: %w", err)
	}
	return &memscaleAlloc{dev: d, a: a, cuda: env.Backend == BackendCUDA}, nil
}

// stream maps a dense stream index to a device stream. On CUDA every
// stream is the default stream (the replay creates no CUDA streams).
func (m *memscaleAlloc) stream(i int32) device.Stream {
	if m.cuda {
		return 0
	}
	return device.Stream(i)
}

func (m *memscaleAlloc) Malloc(size uint64, stream int32) (uint64, error) {
	p, err := m.a.Malloc(size, m.stream(stream))
	return uint64(p), err
}
func (m *memscaleAlloc) Free(addr uint64) error { return m.a.Free(device.Ptr(addr)) }
func (m *memscaleAlloc) Reserved() uint64       { return m.a.Reserved() }
func (m *memscaleAlloc) SetLimit(b uint64) error {
	if err := m.a.SetLimit(b); err != nil {
		return fmt.Errorf("memscale SetLimit(%d): %w", b, err)
	}
	return nil
}
func (m *memscaleAlloc) Counters() Counters {
	s := m.a.Stats()
	return Counters{
		PeakAllocated: uint64(s["allocated_bytes.all.peak"]),
		PeakReserved:  uint64(s["reserved_bytes.all.peak"]),
		DeviceAllocs:  s["num_device_alloc"],
		Mapping:       s["expandable_segments"] == 1,
		Maps:          s["num_map"],
		Unmaps:        s["num_unmap"],
		Remaps:        s["num_remap"],
	}
}

// StepBoundary tells the allocator a step begins (Options.Steps).
func (m *memscaleAlloc) StepBoundary() { m.a.StepBoundary() }

func (m *memscaleAlloc) Close() error {
	return errors.Join(m.a.Close(), m.dev.Close())
}

// deviceAlloc is Device.Alloc/Free for every request.
type deviceAlloc struct {
	dev               device.Device
	sizes             map[uint64]uint64
	live, peak, limit uint64
	allocs            int64
}

func newDeviceAlloc(env Env) (Allocator, error) {
	if env.Backend != BackendCUDA {
		return nil, errors.New("cuda-malloc runs only with --backend cuda (on the simulated device it would measure mmap)")
	}
	d, err := openDevice(env)
	if err != nil {
		return nil, err
	}
	return &deviceAlloc{dev: d, sizes: map[uint64]uint64{}, limit: env.Limit}, nil
}

func (d *deviceAlloc) Malloc(size uint64, _ int32) (uint64, error) {
	if d.limit > 0 && d.live+size > d.limit {
		return 0, fmt.Errorf("cuda-malloc: %d + %d bytes exceed the limit %d: %w", d.live, size, d.limit, device.ErrOutOfMemory)
	}
	p, err := d.dev.Alloc(max(size, 1))
	if err != nil {
		return 0, err
	}
	d.sizes[uint64(p)] = size
	d.live += size
	d.peak = max(d.peak, d.live)
	d.allocs++
	return uint64(p), nil
}
func (d *deviceAlloc) Free(addr uint64) error {
	d.live -= d.sizes[addr]
	delete(d.sizes, addr)
	return d.dev.Free(device.Ptr(addr))
}
func (d *deviceAlloc) Reserved() uint64        { return d.live }
func (d *deviceAlloc) SetLimit(b uint64) error { d.limit = b; return nil }
func (d *deviceAlloc) Counters() Counters {
	return Counters{PeakAllocated: d.peak, PeakReserved: d.peak, DeviceAllocs: d.allocs}
}
func (d *deviceAlloc) Close() error {
	var errs []error
	for p := range d.sizes {
		errs = append(errs, d.dev.Free(device.Ptr(p)))
	}
	return errors.Join(append(errs, d.dev.Close())...)
}
