// Package allocator is a caching allocator of device memory, the Go
// counterpart of PyTorch's CUDACachingAllocator with expandable segments. It
// is written against device.Device only, so it runs unchanged on a GPU
// (device/cuda) and on the simulation (device/sim).
//
// # Overview
//
// Requests are rounded up to 512 bytes (MinBlockSize; a request of 0 bytes
// gets a 512-byte block of its own). Rounded requests up to 1 MiB
// (SmallSize) are served from the small pool, larger ones from the large
// pool, so that long-lived small tensors never pin the pages of large ones.
// A pool's memory comes in segments; a segment is cut into blocks that tile
// it in address order (block.prev/next). A block is allocated, free (cached),
// pending (freed but still in use by streams named with RecordStream), or
// unmapped (address space of an expandable segment with no memory behind it).
//
// Free blocks live in one B-tree per pool ordered by (stream, size,
// address), so best fit is a lower-bound search, and a block is only ever
// handed to its own stream (work on one stream is ordered, so reuse needs no
// synchronization). A block larger than the request is split when at least
// 512 bytes remain (small pool) or more than 1 MiB remains (large pool), as
// PyTorch does, with one refinement: a large-pool remainder that borders
// unmapped address space is split however small, because the next growth of
// the segment extends it instead of stranding it. A freed block coalesces
// with its free neighbours.
//
// # The quick cache
//
// The tree costs about 140 ns per malloc/free pair (find, delete the block,
// insert the remainder; delete the remainder, insert the merged block). The
// common pattern, freeing a block and soon asking for the same size on the
// same stream, skips it: Free parks up to 32 blocks (quickCap) on per-stream,
// per-size stacks without coalescing them, and Malloc pops an exact match
// before it looks at the tree. Parked blocks are ordinary free memory for
// statistics and snapshots; they join the tree (coalescing) whenever Malloc
// misses both the stacks and the tree, before any growth, remapping,
// EmptyCache or out-of-memory handling, so those decisions always see the
// fully coalesced cache. A block remembers its stack while allocated, so a
// cached malloc+free pair costs two uncontended lock/unlock pairs, one
// pointer-map lookup and one stack lookup: about 50-80 ns, with no heap
// allocation.
//
// # Expandable segments
//
// With VMM (device.Info.VMM, the default when the device has it), segments
// are expandable, as PyTorch's expandable_segments:True: each (pool, stream)
// reserves a large range of address space (twice the device capacity; a
// second one if a request ever finds no room) with ReserveAddress and maps
// physical memory into it on demand, one granule (device granularity, 2 MiB
// on current GPUs) per CreatePhysical handle. A growth maps all its granules
// with one Device.MapRange, which sets access once for the whole range
// (PyTorch's expandable segments do the same; cuMemSetAccess is synchronous),
// and a run of free granules is unmapped with one Unmap. Handles stay one
// granule each so that any granule can move on its own (below); larger
// handles would cut cuMemCreate calls but pin granules together (a handle
// is unmapped whole). Unmapped stretches are blocks
// of their own, granule aligned, kept in a per-pool index by (stream,
// address). When the cache cannot serve a request, planGrow picks the
// unmapped block where the request needs the fewest new granules, counting
// the free blocks on either side that it would extend (ties: lowest address),
// maps them and allocates from the coalesced result. So a segment grows
// block by block with at most part of one granule unused at its frontier,
// instead of in 2 MiB/20 MiB/rounded steps whose tails PyTorch leaves free.
//
// Physical memory is not tied to where it is mapped. A granule that lies
// wholly inside a cached free block can be unmapped and mapped wherever it is
// needed: into another stream's segment, the other pool, or the frontier of
// the same segment (counted as num_remap). Memory freed in one place
// therefore backs allocations anywhere, and fragmentation across segments
// disappears: a request fails only when the granules touched by live blocks
// plus the request's own exceed the limit (the property tests check exactly
// this). Growth takes granules in this order:
//
//  1. new ones, while reserved memory stays within the cache bound: the
//     high-water mark of allocated bytes plus max(CacheSlack x that mark,
//     4 granules), or, when a DTR budget is known and that is larger, the
//     budget plus BudgetSlack x the budget (below);
//  2. cached free granules whose stream has finished with them, smallest
//     free blocks first (steal): the fragments that serve few requests go,
//     the large free runs the next large request needs stay;
//  3. new ones, up to the limit;
//  4. at the limit, the cached free granules beside the growth's own window
//     (the part of a free run it cuts that lies outside it, a free block
//     bordering a hole it maps), which the steal leaves alone.
//
// Where a segment grows (planGrow): among all windows of the request's size
// that hold no block in use - cached free blocks and unmapped holes alike,
// the holes being where granules were taken from - the one with the fewest
// unmapped granules, ties to the lowest address; only those granules are
// mapped, one MapRange per hole. A remap therefore moves what the window
// lacks, not a whole block's worth.
//
// With the default CacheSlack of 0, reserved memory stays within a few
// granules of the most ever allocated at once: replaying the five DTR
// training traces, reserved exceeds allocated by 0.03-0.19% at peak (PyTorch's
// segment scheme, Config.DisableVMM, loses 1.6-10.9%; see
// bench/results/allocator-trace-replay.md). Remapping happens only near the
// peak; off-peak the cache keeps everything freed, so steady-state training
// iterations reuse cached blocks without driver calls. A negative CacheSlack
// restores PyTorch's behaviour (cached memory moves only at the limit or in
// EmptyCache).
//
// # Under a DTR budget
//
// A DTR engine holds allocated bytes at its budget for the whole step, so the
// high-water mark is the budget and a bound of mark + 4 granules leaves no
// room: nearly every cache miss remapped (up to 98% of the mapped granules
// per step at 50% of the baseline peak). When the allocator knows the budget
// (Config.Budget, SetBudget, memscale_set_budget; else the eviction
// threshold stands for it), the cache may keep budget x (1 + BudgetSlack)
// mapped, never past the limit, and reuses it in place. DefaultBudgetSlack
// (0.10) keeps reserved memory within 1.1x the budget (up to ~3% more when
// the free memory at the bound lies in pieces holding no whole granule,
// which cannot be unmapped); it removes
// the steady-state remaps where fragmentation is mild (ResNet, the
// Transformer at 50%) and cuts the others by 1.5-5x, while traces whose live
// blocks are a large share of the budget (U-Net, DenseNet) need 1.3-1.5x to
// stop remapping. docs/allocator-budget.md and
// bench/results/alloc-budget-remaps.md have the trade-off, measured.
//
// What remains is fragmentation, and a DTR training step repeats itself.
// Told where steps begin (StepBoundary; C ABI memscale_step_boundary), the
// allocator records each step's large-pool requests (rounded size, stream,
// allocation and free times) and, at the boundary, places them offline with
// every lifetime known (greedy: largest first, each at the lowest offset
// free for its whole lifetime; a plan within 1.25x the bound is improved by
// a search: squeaky-wheel rounds, then other orders). The next step's n-th
// request of a size and stream goes to the offset of the plan's n-th one, in
// a plan segment whose free memory best fit never sees; anything else falls
// back to best fit. While steps are
// recorded, large blocks are split to their rounded size, so the engine's
// usage, and with it the next step's requests, do not depend on placement.
// A plan is used when its span plus the step's other memory fits the cache
// bound (then a repeating step remaps nothing once the plan is in place), or
// needs up to 1.2x the bound (then the granules it cannot hold at once are
// remapped within the step, the ones the plan uses again last first, and the
// plan is dropped if it remaps more than best fit did). See plan.go.
//
// A free block may still be read or written by work queued on its stream, so
// its granules may not be unmapped until that work has finished. PyTorch
// synchronizes the stream before unmapping; that would stall the CPU in the
// middle of training, so the allocator uses stream marks instead: each free
// records the allocator epoch (block.freedAt and its stream's lastFree, two
// integer stores on the hot path); when granules are wanted, an event is
// recorded on the stream of the growth being served if it has a free no mark
// covers yet, covering every free up to the current epoch, and the epoch
// advances. A block is ready once a mark covering its epoch has completed;
// marks are polled without waiting, so on a busy GPU the granules freed
// before the previous growth are the ones that move.
//
// The allocator calls the driver with a stream only during a call that hands
// it that stream (Malloc, Free, RecordStream, and the record_stream events
// of a Free, as PyTorch does). A program may destroy an external stream once
// its memory is freed, and on a real driver a destroyed CUstream is a
// dangling pointer (cuEventRecord on one crashed the first GPU run rather
// than returning an error). So frees on other streams that no mark covers
// are covered by one device synchronization (Device.Synchronize) when their
// memory is wanted, never by a mark recorded later on those streams. A
// stream is forgotten once it holds no segment. The out-of-memory path and
// EmptyCache synchronize the device the same way, as cudaFree does under
// PyTorch's allocator.
//
// EmptyCache waits for the device, then unmaps and releases every free
// whole granule and returns the address space of segments left with nothing
// mapped. Reserved memory (reserved_bytes) is mapped memory; segment counts
// address-space reservations.
//
// # Without VMM
//
// When the device has no VMM (or Config.DisableVMM is set), segments come
// from Device.Alloc, sized as PyTorch sizes them: 2 MiB for the small pool,
// 20 MiB for large requests under 10 MiB, the request rounded up to 2 MiB
// beyond. Blocks never cross segments; EmptyCache and the out-of-memory path
// return whole free segments.
//
// # Streams
//
// RecordStream(p, s) adds a stream that uses p's memory; a stream the device
// cannot record on (another device's, Device.CheckStream) is refused there,
// with the allocation unchanged. At Free an event is recorded on each such
// stream (if that fails, the device is synchronized instead, so the block is
// never leaked) and the block waits in the pending list
// (counted in active_bytes, not allocated_bytes) until they all completed;
// the list is polled at the start of every Malloc, and waited for by the
// out-of-memory path and EmptyCache. Events are pooled.
//
// # Out of memory and limits
//
// Limit (0 = device capacity; SetLimit, SetMemoryFraction) caps the
// physical memory held. When growth falls short, Malloc counts a retry
// (num_alloc_retries), waits for every stream and pending free, coalesces
// the cache, returns empty address space (VMM) or whole free segments (no
// VMM) and tries again, remapping every free granule now ready. If that
// fails and a Reclaimer is installed (SetReclaimer), Malloc releases the
// lock, asks it for the missing bytes and retries, up to 8 rounds
// (maxReclaimRounds) while it frees something. The reclaimer may call Free
// (and Malloc) re-entrantly; Mallocs on several goroutines may call it at
// once. In the library the reclaimer is the host's (memscale_set_reclaimer):
// the Python package asks the DTR engine for victims (evict.Engine.Reclaim,
// memscale_dtr_reclaim) and drops them, which frees their blocks. Finally
// Malloc counts num_ooms, records an "oom" trace event and returns an
// *OOMError stating the request, allocated, reserved, limit and device-free
// bytes, and whether a reclaimer was installed, how often it was asked and
// what it freed; errors.Is(err, device.ErrOutOfMemory) holds.
// EvictionThreshold is stored (one atomic load to read) and reported for the
// engine; the allocator itself only enforces Limit.
//
// # Observability
//
// Stats returns torch.cuda.memory_stats() keys plus memscale's own (limits,
// mapped/physical/virtual bytes, map/unmap/remap counts in granules, map and
// unmap driver calls, the budget and the cache bound in force). Snapshot returns
// torch.cuda.memory._snapshot()'s shape, each mapped run of an expandable
// segment being one segment entry, with a bounded ring of alloc,
// free_requested, free_completed, segment_map/segment_unmap (VMM),
// segment_alloc/segment_free (no VMM) and oom events when TraceCapacity > 0.
// Allocated and Reserved are single atomic loads.
//
// # Concurrency
//
// One mutex guards everything; device calls are made with it held, except
// the Reclaimer, which is called without it (it calls Free). Decisions never
// depend on map iteration order, so a sequence of calls always produces the
// same addresses relative to the segments' bases.
package allocator
