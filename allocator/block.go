package allocator

import (
	"github.com/google/btree"

	"github.com/memscale/memscale/device"
)

// Size classes, as in PyTorch's CUDACachingAllocator.
const (
	// MinBlockSize is the rounding unit and alignment of every block.
	MinBlockSize = 512
	// SmallSize is the largest request served from the small pool.
	SmallSize = 1 << 20
	// smallBuffer is the size of a small-pool segment without VMM.
	smallBuffer = 2 << 20
	// largeBuffer is the size of a large-pool segment for requests below
	// minLargeAlloc without VMM.
	largeBuffer = 20 << 20
	// minLargeAlloc is the request size from which a segment of its own,
	// rounded to roundLarge, is allocated without VMM.
	minLargeAlloc = 10 << 20
	// roundLarge is the rounding of those segments.
	roundLarge = 2 << 20
	// MaxSize is the largest request Malloc accepts (256 TiB, beyond any
	// device's address space); larger sizes are ErrInvalidSize.
	MaxSize = 1 << 48
)

// poolKind selects the small or the large pool.
type poolKind uint8

const (
	smallPool poolKind = iota
	largePool
	numPools
)

func (p poolKind) String() string {
	if p == smallPool {
		return "small"
	}
	return "large"
}

// poolOf returns the pool serving a rounded size.
func poolOf(rounded uint64) poolKind {
	if rounded <= SmallSize {
		return smallPool
	}
	return largePool
}

// roundSize rounds a request up to MinBlockSize; 0 becomes MinBlockSize.
func roundSize(n uint64) uint64 {
	if n == 0 {
		return MinBlockSize
	}
	return (n + MinBlockSize - 1) &^ (MinBlockSize - 1)
}

// blockState is where a block is in its life.
type blockState uint8

const (
	// stateFree: mapped memory in the cache (in its pool's tree, or in the
	// quick cache when block.quick is set).
	stateFree blockState = iota
	// stateAllocated: handed out by Malloc, not yet freed.
	stateAllocated
	// statePending: freed, waiting for events on streams given to
	// RecordStream before it may be reused.
	statePending
	// stateUnmapped: address space of an expandable segment with no physical
	// memory behind it. Always aligned to the granularity at both ends.
	stateUnmapped
)

// block is a contiguous piece of a segment. The blocks of a segment tile it in
// address order through prev/next.
type block struct {
	addr   device.Ptr
	size   uint64
	req    uint64 // requested size while allocated or pending
	stream device.Stream
	seg    *segment
	prev   *block
	next   *block
	state  blockState
	quick  bool // free and parked in the quick cache instead of the tree

	// freedAt is the allocator epoch when the memory was last released by its
	// stream; the memory is idle once a stream mark covering it completed.
	freedAt uint64

	// Quick-cache links: the stack the block was last on (kept while it is
	// allocated, so that Free finds it without a lookup), the next block on
	// that stack, and the list of all quick blocks.
	qlist        *quickList
	knext        *block
	qprev, qnext *block

	streams []device.Stream // extra streams from RecordStream
	events  []device.Event  // outstanding events of a pending free

	// rec is 1 + the index of the block's request in the step recorded
	// for step plans (0 = not recorded), recStep that step (plan.go).
	rec     int32
	recStep uint32
}

func (b *block) end() device.Ptr { return b.addr + device.Ptr(b.size) }

// isSplit reports whether b is only part of its segment (PyTorch's
// Block::is_split); free split blocks are counted as inactive_split.
func (b *block) isSplit() bool { return b.prev != nil || b.next != nil }

// pool returns b's pool.
func (b *block) pool() poolKind { return b.seg.pool }

// segment is one piece of address space the allocator carves blocks from:
// with VMM an expandable range reserved with ReserveAddress whose pages are
// mapped on demand, without VMM one Device.Alloc allocation.
type segment struct {
	base       device.Ptr
	size       uint64
	pool       poolKind
	stream     device.Stream
	st         *streamState
	expandable bool
	head       *block
	// handles holds the physical chunk mapped at each granule of an
	// expandable segment (0 where unmapped).
	handles []device.Handle
	mapped  uint64 // bytes with memory behind them
	// plan marks the segment of a step plan (plan.go): its free blocks are
	// in the plans' tree, not the pool's, so best fit never takes them.
	plan bool
}

func (s *segment) end() device.Ptr { return s.base + device.Ptr(s.size) }

// freeLess orders the free blocks of a pool for best fit: by stream, then
// size, then address (PyTorch's BlockComparatorSize).
func freeLess(a, b *block) bool {
	if a.stream != b.stream {
		return a.stream < b.stream
	}
	if a.size != b.size {
		return a.size < b.size
	}
	return a.addr < b.addr
}

// addrLess orders unmapped blocks by stream and address.
func addrLess(a, b *block) bool {
	if a.stream != b.stream {
		return a.stream < b.stream
	}
	return a.addr < b.addr
}

// pool holds the cached and the unmapped blocks of one size class.
type pool struct {
	free     *btree.BTreeG[*block]
	unmapped *btree.BTreeG[*block]
}

const btreeDegree = 16

func newPool() pool {
	return pool{
		free:     btree.NewG(btreeDegree, freeLess),
		unmapped: btree.NewG(btreeDegree, addrLess),
	}
}

// quickList is one quick-cache stack: blocks freed by allocations of one
// rounded size on one stream.
type quickList struct {
	head   *block
	stream device.Stream
	size   uint64
	dead   bool // dropped from the index; blocks must look their stack up again
}

// quickStream indexes the quick stacks of one stream by rounded size.
type quickStream struct {
	s     device.Stream
	lists map[uint64]*quickList
}
