package planner

import (
	"github.com/memscale/memscale/internal/placement"
	"github.com/memscale/memscale/replay"
)

// lifetimes is a replay memory model that places nothing but records when
// each storage is allocated and freed, on a clock that ticks at every
// allocation and free: the storages' lifetimes in the schedule the replay
// ran, as placement buffers.
type lifetimes struct {
	bufs  []placement.Buffer
	clock int64
	live  uint64
	peak  uint64
}

// Name implements replay.MemoryModel.
func (*lifetimes) Name() string { return "lifetimes" }

// UsageSource implements replay.MemoryModel: the engine counts bytes.
func (*lifetimes) UsageSource() func() uint64 { return nil }

// Alloc implements replay.MemoryModel.
func (m *lifetimes) Alloc(size uint64, _ bool) (replay.Block, error) {
	m.clock++
	m.bufs = append(m.bufs, placement.Buffer{Size: size, Start: m.clock, End: -1})
	m.live += size
	m.peak = max(m.peak, m.live)
	return replay.Block(len(m.bufs) - 1), nil
}

// Free implements replay.MemoryModel.
func (m *lifetimes) Free(b replay.Block) error {
	m.clock++
	m.bufs[b].End = m.clock
	m.live -= m.bufs[b].Size
	return nil
}

// Peak implements replay.MemoryModel.
func (m *lifetimes) Peak() uint64 { return m.peak }

// buffers returns the lifetimes; storages never freed live to the end.
func (m *lifetimes) buffers() []placement.Buffer {
	end := m.clock + 1
	for i := range m.bufs {
		if m.bufs[i].End < 0 {
			m.bufs[i].End = end
		}
	}
	return m.bufs
}
