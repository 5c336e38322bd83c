package evict

import (
	"slices"

	rc "github.com/memscale/memscale/recompute"
)

// selector is the candidate set: the storages that may be evicted, and the
// choice of the best one.
type selector interface {
	// add makes s a candidate (no-op if it is one).
	add(s rc.StorageID)
	// remove takes s out of the candidates (no-op if it is not one).
	remove(s rc.StorageID)
	// lowered says s's key may have decreased.
	lowered(s rc.StorageID)
	// fell says keys may have decreased through the neighbourhood cost
	// (never through the cost's bound, tracker.bound), whose they are not
	// said.
	fell()
	// pick returns the candidate to evict at clock now.
	pick(now int64) (rc.StorageID, bool)
	// len returns the number of candidates.
	len() int
}

// scanSelector computes every candidate's key at each pick: the definition
// the index is checked against.
type scanSelector struct {
	e       *Engine
	members []rc.StorageID
	pos     []int32  // per storage: index in members, -1 if absent
	seqs    []uint64 // per storage: when it last became a candidate
	seq     uint64
}

func newScanSelector(e *Engine) *scanSelector { return &scanSelector{e: e} }

// reserve makes room for n storages up front (Config.Reserve).
func (s *scanSelector) reserve(n int) {
	s.members = slices.Grow(s.members, n)
	s.pos = slices.Grow(s.pos, n)
	s.seqs = slices.Grow(s.seqs, n)
}

func (s *scanSelector) add(id rc.StorageID) {
	for int(id) >= len(s.pos) {
		s.pos = append(s.pos, -1)
		s.seqs = append(s.seqs, 0)
	}
	if s.pos[id] >= 0 {
		return
	}
	s.seq++
	s.seqs[id] = s.seq
	s.pos[id] = int32(len(s.members))
	s.members = append(s.members, id)
}

func (s *scanSelector) remove(id rc.StorageID) {
	if int(id) >= len(s.pos) || s.pos[id] < 0 {
		return
	}
	i := s.pos[id]
	last := s.members[len(s.members)-1]
	s.members[i] = last
	s.pos[last] = i
	s.members = s.members[:len(s.members)-1]
	s.pos[id] = -1
}

func (s *scanSelector) lowered(rc.StorageID) {}

func (s *scanSelector) fell() {}

func (s *scanSelector) len() int { return len(s.members) }

func (s *scanSelector) pick(now int64) (rc.StorageID, bool) {
	if len(s.members) == 0 {
		return 0, false
	}
	best := s.e.key(s.members[0])
	best.seq = s.seqs[s.members[0]]
	for _, id := range s.members[1:] {
		k := s.e.key(id)
		k.seq = s.seqs[id]
		if before(k, best, now, s.e.stale) {
			best = k
		}
	}
	return rc.StorageID(best.id), true
}
