// Package nativemodel is a model of PyTorch's native CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator) that runs
// without a GPU: the same rounding, small and large pools, best fit by
// (stream, size, address), split and merge rules, max_split_size,
// roundup_power2_divisions, the out-of-memory path (free one oversize block,
// then every unsplit cached segment, retry) and expandable segments (one
// growing segment per stream and pool, mapped in 2 MiB chunks for the small
// pool and 20 MiB for the large one, lowest address first, unmapped on the
// out-of-memory path).
//
// It tracks addresses and sizes only: no memory is touched. cudaMalloc is a
// bump allocator of addresses, so ties in best fit between segments may
// break differently than on a GPU, where cudaMalloc picks the addresses.
// Not modelled: record_stream events (every free completes at once), CUDA
// graph pools, garbage_collection_threshold, set_per_process_memory_fraction
// (use Config.Capacity), IPC.
package nativemodel

import (
	"errors"
	"fmt"

	"github.com/google/btree"
)

// block is a run of device memory, as the C++ Block.
type block struct {
	addr, size uint64
	requested  uint64
	stream     int32
	pool       *pool
	allocated  bool
	mapped     bool
	prev, next *block
	seg        *expSeg // nil unless the block lies in an expandable segment
}

// pool is a BlockPool: free mapped blocks by (stream, size, address),
// unmapped expandable blocks by (stream, address).
type pool struct {
	small    bool
	blocks   *btree.BTreeG[*block]
	unmapped *btree.BTreeG[*block]
}

func lessSize(a, b *block) bool {
	if a.stream != b.stream {
		return a.stream < b.stream
	}
	if a.size != b.size {
		return a.size < b.size
	}
	return a.addr < b.addr
}

func lessAddr(a, b *block) bool {
	if a.stream != b.stream {
		return a.stream < b.stream
	}
	return a.addr < b.addr
}

func newPool(small bool) *pool {
	return &pool{small: small, blocks: btree.NewG(16, lessSize), unmapped: btree.NewG(16, lessAddr)}
}

// expSeg is an ExpandableSegment: a reserved range mapped in chunks.
type expSeg struct {
	base, size, chunk uint64
}

// Stats are the model's counters, with the meaning of the
// torch.cuda.memory_stats() keys named.
type Stats struct {
	// Allocated is allocated_bytes.all.current; PeakAllocated its peak.
	Allocated, PeakAllocated uint64
	// Reserved is reserved_bytes.all.current; PeakReserved its peak.
	Reserved, PeakReserved uint64
	// Requested is requested_bytes.all.current; PeakRequested its peak.
	Requested, PeakRequested uint64
	// Segments is segment.all.current (cudaMalloc'd segments; expandable
	// segments are not counted, as in PyTorch).
	Segments int64
	// NumDeviceAlloc and NumDeviceFree count cudaMalloc/cudaFree calls, or
	// map/unmap calls of expandable segments (num_device_alloc/free).
	NumDeviceAlloc, NumDeviceFree int64
	// ChunksMapped counts the physical chunks (2/20 MiB) mapped into
	// expandable segments (one cuMemCreate + cuMemMap each).
	ChunksMapped int64
	// NumAllocRetries is num_alloc_retries; NumOOMs is num_ooms.
	NumAllocRetries, NumOOMs int64
	// Allocations is allocation.all.current.
	Allocations int64
}

// ErrOutOfMemory is wrapped by the error of a Malloc that would raise
// torch.OutOfMemoryError.
var ErrOutOfMemory = errors.New("CUDA out of memory")

// Model is one device's caching allocator.
type Model struct {
	cfg         Config
	small       *pool
	large       *pool
	active      map[uint64]*block
	nextAddr    uint64
	stats       Stats
	segs        map[*expSeg]bool
	addressSize uint64
}

// New returns an empty allocator.
func New(cfg Config) *Model {
	m := &Model{
		cfg: cfg, small: newPool(true), large: newPool(false),
		active: map[uint64]*block{}, nextAddr: 1 << 32, segs: map[*expSeg]bool{},
	}
	// An expandable segment reserves 1 1/8 of the device's memory.
	m.addressSize = 1 << 40
	if cfg.Capacity > 0 {
		m.addressSize = cfg.Capacity + cfg.Capacity/8
	}
	return m
}

// Config returns the configuration.
func (m *Model) Config() Config { return m.cfg }

// Stats returns the counters.
func (m *Model) Stats() Stats { return m.stats }

// SetCapacity changes the device memory (0 = unlimited).
func (m *Model) SetCapacity(c uint64) { m.cfg.Capacity = c }

// MaxSize is the largest request the model places (256 TiB, the memscale
// allocator's allocator.MaxSize): beyond any device, and small enough that
// rounding it cannot wrap. A larger request is out of memory, as a
// cudaMalloc of it would be.
const MaxSize = 1 << 48

// Malloc allocates size bytes on stream and returns the address. When even
// an emptied cache cannot serve it, the error wraps ErrOutOfMemory; so does a
// request above MaxSize, or with expandable segments one larger than a
// segment (1 1/8 of the capacity, or 1 TiB without one).
func (m *Model) Malloc(orig uint64, stream int32) (uint64, error) {
	if orig > MaxSize {
		m.stats.NumOOMs++
		return 0, fmt.Errorf("nativemodel: tried to allocate %d bytes, above the largest request of %d bytes (256 TiB): %w",
			orig, uint64(MaxSize), ErrOutOfMemory)
	}
	size := m.cfg.RoundSize(orig)
	p := m.large
	if size <= KSmallSize {
		p = m.small
	}
	allocSize := AllocationSize(size)
	b := m.getFreeBlock(p, size, stream)
	if b == nil {
		b = m.allocBlock(p, size, allocSize, stream, false)
		if b == nil && m.releaseAvailableCachedBlocks(p, size, stream) {
			b = m.allocBlock(p, size, allocSize, stream, false)
		}
		if b == nil {
			m.releaseCachedBlocks()
			b = m.allocBlock(p, size, allocSize, stream, true)
		}
	}
	if b == nil {
		m.stats.NumOOMs++
		return 0, fmt.Errorf("nativemodel: tried to allocate %d bytes (segment %d) with %d allocated, %d reserved, capacity %d: %w",
			orig, allocSize, m.stats.Allocated, m.stats.Reserved, m.cfg.Capacity, ErrOutOfMemory)
	}
	b = m.allocFoundBlock(b, size, orig, m.shouldSplit(b, size))
	return b.addr, nil
}

// Free frees the block at addr.
func (m *Model) Free(addr uint64) error {
	b := m.active[addr]
	if b == nil {
		return fmt.Errorf("nativemodel: free of 0x%x: invalid device pointer", addr)
	}
	delete(m.active, addr)
	b.allocated = false
	m.stats.Allocated -= b.size
	m.stats.Requested -= b.requested
	m.stats.Allocations--
	m.freeBlock(b)
	return nil
}

// EmptyCache is torch.cuda.empty_cache(): release_cached_blocks.
func (m *Model) EmptyCache() { m.releaseCachedBlocks() }

func (m *Model) shouldSplit(b *block, size uint64) bool {
	remaining := b.size - size
	if b.pool.small || m.cfg.ExpandableSegments {
		return remaining >= KMinBlockSize
	}
	return size < m.cfg.maxSplit() && remaining > KSmallSize
}

// expandableSize is a free block's size plus the unmapped block after it.
func expandableSize(b *block) uint64 {
	if b.next != nil && !b.next.mapped {
		return b.size + b.next.size
	}
	return b.size
}

func (m *Model) getFreeBlock(p *pool, size uint64, stream int32) *block {
	var cur *block
	p.blocks.AscendGreaterOrEqual(&block{stream: stream, size: size}, func(b *block) bool {
		if cur == nil {
			cur = b
			return cur.stream == stream && cur.seg != nil && m.cfg.ExpandableSegments
		}
		// Among expandable blocks, best fit counts the unmapped space
		// each could grow into.
		if cur.seg != nil && b.stream == stream && expandableSize(b) < expandableSize(cur) {
			cur = b
			return true
		}
		return false
	})
	if cur == nil || cur.stream != stream {
		return nil
	}
	mss := m.cfg.maxSplit()
	if size < mss && cur.size >= mss {
		return nil // do not return an oversized block for a small request
	}
	if size >= mss && cur.size >= size+KLargeBuffer {
		return nil // an oversized block may be rounded up, but only within 20 MiB
	}
	p.blocks.Delete(cur)
	return cur
}

func (m *Model) allocBlock(p *pool, size, allocSize uint64, stream int32, retry bool) *block {
	if retry {
		m.stats.NumAllocRetries++
	}
	if m.cfg.ExpandableSegments {
		return m.tryAllocateExpandable(p, size, stream)
	}
	if m.cfg.Capacity > 0 && m.stats.Reserved+allocSize > m.cfg.Capacity {
		return nil
	}
	b := &block{addr: m.nextAddr, size: allocSize, stream: stream, pool: p, mapped: true}
	m.nextAddr += (allocSize + KRoundLarge - 1) / KRoundLarge * KRoundLarge
	m.addReserved(allocSize)
	m.stats.Segments++
	m.stats.NumDeviceAlloc++
	return b
}

func (m *Model) addReserved(n uint64) {
	m.stats.Reserved += n
	m.stats.PeakReserved = max(m.stats.PeakReserved, m.stats.Reserved)
}

func (m *Model) allocFoundBlock(b *block, size, orig uint64, split bool) *block {
	if split {
		rest := b
		b = &block{addr: rest.addr, size: size, stream: rest.stream, pool: rest.pool, mapped: true, seg: rest.seg}
		b.prev = rest.prev
		if b.prev != nil {
			b.prev.next = b
		}
		b.next = rest
		rest.prev = b
		rest.addr += size
		rest.size -= size
		rest.pool.blocks.ReplaceOrInsert(rest)
	}
	b.allocated = true
	b.requested = orig
	m.active[b.addr] = b
	m.stats.Allocated += b.size
	m.stats.PeakAllocated = max(m.stats.PeakAllocated, m.stats.Allocated)
	m.stats.Requested += orig
	m.stats.PeakRequested = max(m.stats.PeakRequested, m.stats.Requested)
	m.stats.Allocations++
	return b
}

// tryMerge merges src into dst when src is free with the same mapping
// state, and returns the bytes taken over.
func tryMerge(dst, src *block) uint64 {
	if src == nil || src.allocated || src.mapped != dst.mapped {
		return 0
	}
	if dst.prev == src {
		dst.addr = src.addr
		dst.prev = src.prev
		if dst.prev != nil {
			dst.prev.next = dst
		}
	} else {
		dst.next = src.next
		if dst.next != nil {
			dst.next.prev = dst
		}
	}
	dst.size += src.size
	if src.mapped {
		src.pool.blocks.Delete(src)
	} else {
		src.pool.unmapped.Delete(src)
	}
	return src.size
}

func (m *Model) freeBlock(b *block) {
	tryMerge(b, b.prev)
	tryMerge(b, b.next)
	b.pool.blocks.ReplaceOrInsert(b)
}

// releaseAvailableCachedBlocks frees one cached oversize block large enough
// for the request, or the largest ones until enough is freed.
func (m *Model) releaseAvailableCachedBlocks(p *pool, size uint64, stream int32) bool {
	mss := m.cfg.maxSplit()
	if m.cfg.MaxSplitSize == 0 {
		return false
	}
	key := &block{stream: stream, size: max(size, mss)}
	var found *block
	p.blocks.AscendGreaterOrEqual(key, func(b *block) bool { found = b; return false })
	if found != nil && found.stream == stream {
		if found.seg != nil {
			return false // PyTorch asserts here; expandable blocks are never released this way
		}
		m.releaseBlock(found)
		return true
	}
	var victims []*block
	var total uint64
	p.blocks.DescendLessOrEqual(key, func(b *block) bool {
		if total >= key.size || b.size < mss || b.stream != stream || b.seg != nil {
			return false
		}
		total += b.size
		victims = append(victims, b)
		return true
	})
	for _, b := range victims {
		m.releaseBlock(b)
	}
	return total >= key.size
}

// releaseBlock cudaFrees a cached segment.
func (m *Model) releaseBlock(b *block) {
	b.pool.blocks.Delete(b)
	m.stats.Reserved -= b.size
	m.stats.Segments--
	m.stats.NumDeviceFree++
}

// releaseCachedBlocks frees every unsplit cached segment and unmaps the free
// chunks of expandable segments.
func (m *Model) releaseCachedBlocks() {
	for _, p := range []*pool{m.large, m.small} {
		var unmap, release []*block
		p.blocks.Ascend(func(b *block) bool {
			if b.seg != nil {
				unmap = append(unmap, b)
			} else if b.prev == nil && b.next == nil {
				release = append(release, b)
			}
			return true
		})
		for _, b := range release {
			m.releaseBlock(b)
		}
		for _, b := range unmap {
			m.unmapBlock(b)
			if !b.mapped && b.prev == nil && b.next == nil {
				p.unmapped.Delete(b)
				delete(m.segs, b.seg)
			}
		}
	}
}

// findExpandableBlock returns the lowest-addressed run of free and unmapped
// blocks of stream's segments with room for size, or a new segment; nil when
// size is larger than a whole segment.
func (m *Model) findExpandableBlock(p *pool, size uint64, stream int32) *block {
	allocatable := func(b *block) bool { return b != nil && !b.allocated }
	hasRoom := func(b *block) bool {
		var n uint64
		for n < size && allocatable(b) {
			n += b.size
			b = b.next
		}
		return n >= size
	}
	var found *block
	p.unmapped.AscendGreaterOrEqual(&block{stream: stream}, func(c *block) bool {
		if c.stream != stream {
			return false
		}
		if allocatable(c.prev) {
			c = c.prev
		}
		if hasRoom(c) {
			found = c
			return false
		}
		return true
	})
	if found != nil {
		return found
	}
	chunk := uint64(KLargeBuffer)
	if p.small {
		chunk = KSmallBuffer
	}
	segSize := (m.addressSize + chunk - 1) / chunk * chunk
	if size > segSize {
		return nil // no segment can hold it: out of memory
	}
	es := &expSeg{base: m.nextAddr, size: segSize, chunk: chunk}
	m.nextAddr += (es.size + KRoundLarge - 1) / KRoundLarge * KRoundLarge
	m.segs[es] = true
	c := &block{addr: es.base, size: es.size, stream: stream, pool: p, seg: es}
	p.unmapped.ReplaceOrInsert(c)
	return c
}

// mapBlock maps the chunks covering the first size bytes of the unmapped
// block b (rounded up to whole chunks) and merges it with free neighbours.
func (m *Model) mapBlock(b *block, size uint64) bool {
	es := b.seg
	begin := (b.addr - es.base) / es.chunk
	end := (b.addr + size - es.base + es.chunk - 1) / es.chunk
	n := (end - begin) * es.chunk
	if m.cfg.Capacity > 0 && m.stats.Reserved+n > m.cfg.Capacity {
		return false
	}
	p := b.pool
	p.unmapped.Delete(b)
	b.mapped = true
	if n < b.size {
		rest := &block{addr: b.addr + n, size: b.size - n, stream: b.stream, pool: p, seg: es}
		rest.prev, rest.next = b, b.next
		if b.next != nil {
			b.next.prev = rest
		}
		b.next = rest
		p.unmapped.ReplaceOrInsert(rest)
		b.size = n
	}
	tryMerge(b, b.prev)
	tryMerge(b, b.next)
	p.blocks.ReplaceOrInsert(b)
	m.addReserved(n)
	m.stats.NumDeviceAlloc++
	m.stats.ChunksMapped += int64(end - begin)
	return true
}

func (m *Model) tryAllocateExpandable(p *pool, size uint64, stream int32) *block {
	c := m.findExpandableBlock(p, size, stream)
	if c == nil || !c.mapped && !m.mapBlock(c, min(c.size, size)) {
		return nil
	}
	for c.size < size {
		next := c.next
		if next == nil || !m.mapBlock(next, min(size-c.size, next.size)) {
			return nil
		}
		c = next
	}
	p.blocks.Delete(c)
	return c
}

// unmapBlock unmaps the whole chunks inside the free block b.
func (m *Model) unmapBlock(b *block) {
	es := b.seg
	begin := (b.addr - es.base + es.chunk - 1) / es.chunk
	end := (b.addr + b.size - es.base) / es.chunk
	if begin >= end {
		return
	}
	p := b.pool
	ptr, n := es.base+begin*es.chunk, (end-begin)*es.chunk
	p.blocks.Delete(b)
	if before := ptr - b.addr; before > 0 {
		f := &block{addr: b.addr, size: before, stream: b.stream, pool: p, mapped: true, seg: es}
		f.prev, f.next = b.prev, b
		if b.prev != nil {
			b.prev.next = f
		}
		b.prev = f
		p.blocks.ReplaceOrInsert(f)
	}
	if after := b.size - (ptr - b.addr) - n; after > 0 {
		f := &block{addr: ptr + n, size: after, stream: b.stream, pool: p, mapped: true, seg: es}
		f.prev, f.next = b, b.next
		if b.next != nil {
			b.next.prev = f
		}
		b.next = f
		p.blocks.ReplaceOrInsert(f)
	}
	b.addr, b.size, b.mapped = ptr, n, false
	tryMerge(b, b.prev)
	tryMerge(b, b.next)
	p.unmapped.ReplaceOrInsert(b)
	m.stats.Reserved -= n
	m.stats.NumDeviceFree++
}
