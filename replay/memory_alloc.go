package replay

import (
	"errors"
	"fmt"
	"time"

	"github.com/memscale/memscale/allocator"
	"github.com/memscale/memscale/device"
	"github.com/memscale/memscale/device/sim"
)

// AllocatorModel places every storage of a replay in an allocator.Allocator
// whose hard limit is the budget: sizes are rounded and blocks placed as the
// allocator does, so fragmentation can make a block fail to fit although the
// bytes in use are under the budget; the replay then evicts more. The
// engine's usage is the allocator's allocated bytes.
type AllocatorModel struct {
	a      *allocator.Allocator
	closer func() error
	peak   uint64
	// lat, when not nil, collects the latency of every Malloc
	// (RunAllocatorSteps).
	lat []time.Duration
}

// NewAllocatorModel wraps an allocator (the caller keeps ownership).
func NewAllocatorModel(a *allocator.Allocator) *AllocatorModel {
	return &AllocatorModel{a: a}
}

// NewSimAllocatorModel creates a simulated card and an allocator on it whose
// hard limit (reserved bytes) is budget, for a replay under that budget.
// Close releases both.
func NewSimAllocatorModel(budget uint64) (*AllocatorModel, error) {
	if budget == 0 {
		return nil, errors.New("replay: the allocator memory model needs a budget (its hard limit)")
	}
	gran := uint64(sim.DefaultGranularity)
	capacity := (budget/gran + 2) * gran
	dev, err := sim.New(sim.Config{Capacity: capacity})
	if err != nil {
		return nil, fmt.Errorf("replay: simulated card of %d bytes: %w", capacity, err)
	}
	a, err := allocator.New(allocator.Config{Device: dev, Limit: budget})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("replay: allocator with limit %d: %w", budget, err), dev.Close())
	}
	return &AllocatorModel{a: a, closer: func() error { return errors.Join(a.Close(), dev.Close()) }}, nil
}

// Name implements MemoryModel.
func (m *AllocatorModel) Name() string { return "allocator" }

// UsageSource implements MemoryModel: the allocator's allocated bytes.
func (m *AllocatorModel) UsageSource() func() uint64 { return m.a.Allocated }

// pinnedStream is the allocator stream of pinned storages. The allocator
// keeps its segments per (pool, stream), so pinned storages get segments of
// their own: a real program allocates its parameters before any activation,
// while a trace brings them in one layer at a time, between short-lived
// activations, which would fragment the pool for good.
const pinnedStream device.Stream = 1

// Alloc implements MemoryModel. Pinned storages are placed on a stream of
// their own, apart from transient ones. An out-of-memory error of the
// allocator wraps ErrNoRoom.
func (m *AllocatorModel) Alloc(size uint64, pinned bool) (Block, error) {
	s := device.Stream(0)
	if pinned {
		s = pinnedStream
	}
	var t0 time.Time
	if m.lat != nil {
		t0 = time.Now()
	}
	p, err := m.a.Malloc(size, s)
	if m.lat != nil {
		m.lat = append(m.lat, time.Since(t0))
	}
	if err != nil {
		if errors.Is(err, device.ErrOutOfMemory) {
			return 0, fmt.Errorf("%w: %w", ErrNoRoom, err)
		}
		return 0, err
	}
	m.peak = max(m.peak, m.a.Allocated())
	return Block(p), nil
}

// Free implements MemoryModel.
func (m *AllocatorModel) Free(b Block) error { return m.a.Free(device.Ptr(b)) }

// Peak implements MemoryModel: the highest allocated bytes seen.
func (m *AllocatorModel) Peak() uint64 { return m.peak }

// Allocator returns the allocator (for its stats and snapshot).
func (m *AllocatorModel) Allocator() *allocator.Allocator { return m.a }

// Close releases what NewSimAllocatorModel created (nothing for a model from
// NewAllocatorModel).
func (m *AllocatorModel) Close() error {
	if m.closer == nil {
		return nil
	}
	return m.closer()
}
