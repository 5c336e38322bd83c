package allocator

// Stats maps torch.cuda.memory_stats() key names (and memscale's own keys) to
// values. Per-pool counters come as NAME.{all,small_pool,large_pool}.
// {current,peak,allocated,freed}:
//
//	allocation, allocated_bytes    live allocations (blocks handed out)
//	requested_bytes                bytes asked for by those allocations
//	active, active_bytes           allocated plus freed-but-pending blocks
//	inactive_split, ..._bytes      cached free blocks that are part of a segment
//	segment                        segments (expandable ranges or Alloc chunks)
//	reserved_bytes                 memory mapped in segments
//
// Scalars: num_alloc_retries, num_ooms, num_sync_all_streams,
// num_device_alloc, num_device_free, max_split_size (-1: unlimited), the
// oversize_allocations/oversize_segments counters (always 0: blocks are never
// too big to split), and the memscale keys documented on Allocator.Stats.
type Stats map[string]int64

// statKind is one per-pool counter.
type statKind int

const (
	stAllocation statKind = iota
	stAllocatedBytes
	stRequestedBytes
	stActive
	stActiveBytes
	stInactiveSplit
	stInactiveSplitBytes
	stSegment
	stReservedBytes
	numStatKinds
)

var statNames = [numStatKinds]string{
	"allocation", "allocated_bytes", "requested_bytes", "active", "active_bytes",
	"inactive_split", "inactive_split_bytes", "segment", "reserved_bytes",
}

var statPoolNames = [3]string{"all", "small_pool", "large_pool"}

// stat is one counter: its current value, the peak since the last reset and
// the totals added and removed.
type stat struct {
	cur, peak, alloc, freed int64
}

func (s *stat) add(d int64) {
	s.cur += d
	if d >= 0 {
		s.alloc += d
		if s.cur > s.peak {
			s.peak = s.cur
		}
	} else {
		s.freed -= d
	}
}

// statTable holds every per-pool counter; index 0 is "all", 1+pool the pool.
type statTable [numStatKinds][3]stat

func (t *statTable) add(k statKind, p poolKind, d int64) {
	all, pool := &t[k][0], &t[k][1+p]
	all.cur += d
	pool.cur += d
	if d >= 0 {
		all.alloc += d
		pool.alloc += d
		all.peak = max(all.peak, all.cur)
		pool.peak = max(pool.peak, pool.cur)
	} else {
		all.freed -= d
		pool.freed -= d
	}
}

func (t *statTable) cur(k statKind) int64 { return t[k][0].cur }

func (t *statTable) resetPeaks() {
	for k := range t {
		for p := range t[k] {
			t[k][p].peak = t[k][p].cur
		}
	}
}

// counters are the scalar statistics.
type counters struct {
	allocRetries   int64
	ooms           int64
	syncAllStreams int64
	deviceAllocs   int64
	deviceFrees    int64
	maps           int64 // granules mapped
	unmaps         int64 // granules unmapped
	remaps         int64 // granules moved from cached free memory to a new place
	mapCalls       int64 // MapRange calls
	unmapCalls     int64 // Unmap calls
	quickHits      int64
	marks          int64 // stream marks recorded
}

// fill writes every key into m.
func (t *statTable) fill(m Stats) {
	for k := statKind(0); k < numStatKinds; k++ {
		for p := 0; p < 3; p++ {
			prefix := statNames[k] + "." + statPoolNames[p] + "."
			s := t[k][p]
			m[prefix+"current"] = s.cur
			m[prefix+"peak"] = s.peak
			m[prefix+"allocated"] = s.alloc
			m[prefix+"freed"] = s.freed
		}
	}
	for _, name := range []string{"oversize_allocations", "oversize_segments"} {
		for _, f := range []string{"current", "peak", "allocated", "freed"} {
			m[name+"."+f] = 0
		}
	}
}
