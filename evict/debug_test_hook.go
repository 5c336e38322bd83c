package evict

import (
	"fmt"
	"os"

	rc "github.com/memscale/memscale/recompute"
)

var debugPickN = -1

func init() {
	if v := os.Getenv("EVICT_DEBUG_PICK"); v != "" {
		fmt.Sscan(v, &debugPickN)
	}
}

func (s *scanSelector) debugDump(n int) {
	if n != debugPickN {
		return
	}
	for _, id := range s.members {
		st := s.e.g.Storage(id)
		if true {
			fmt.Println("MEMBER", st.Root, st.Size, s.seqs[id])
		}
	}
}

func (e *Engine) debugEvict(root int, extra uint64) {
	if root == debugPickN {
		fmt.Println("EVICT usage", e.usage, "budget", e.cfg.Budget, "extra", extra)
	}
}

func (e *Engine) debugOOM() {
	if os.Getenv("EVICT_DEBUG_OOM") == "" {
		return
	}
	var pinned, locked, other uint64
	for i := 0; i < e.g.NumStorages(); i++ {
		st := e.g.Storage(rc.StorageID(i))
		if st.State != rc.Resident {
			continue
		}
		switch {
		case st.Pins > 0:
			pinned += st.Size
		case st.Locks > 0:
			locked += st.Size
			if st.Size > 1<<20 {
				fmt.Println("LOCKED", st.Root, st.Size, st.Locks, st.Refs)
			}
		default:
			other += st.Size
		}
	}
	fmt.Println("OOM pinned", pinned, "locked", locked, "other", other)
}
