// Parking: copying a locked storage to host memory while nested
// rematerializations need its room. See doc.go for the design.

package evict

import (
	"fmt"

	"github.com/memscale/memscale/internal/satmath"

	rc "github.com/memscale/memscale/recompute"
)

// Park swaps t's storage out to host memory although it may be locked, for
// a caller whose nested rebuild found nothing evictable: the storages held
// by the outer levels of a rebuild (the running op's resident inputs, the
// inputs of the held steps of outer plans) are not needed until the inner
// rebuild is done, and parked they leave it their room. The locks stay;
// whoever holds them checks, before reading the storage, that it is
// resident and has it swapped back in (a plan of one swap-in step) if not.
// Parking is on with Config.Park. It reports whether
// t's storage was parked: not when parking is off, or the storage is not
// resident, pinned, empty, or would pass Config.OffloadLimit.
func (e *Engine) Park(t rc.TensorID) (bool, error) {
	x, err := e.tensor(t)
	if err != nil {
		return false, fmt.Errorf("evict: park: %w", err)
	}
	s := x.Storage
	st := e.g.Storage(s)
	if !e.cfg.Park || st.State != rc.Resident || st.Pins > 0 || st.Size == 0 || !e.swapFits(st.Size) {
		return false, nil
	}
	e.swapOut(s, st)
	e.stats.Parked++
	e.stats.BytesEvicted = satmath.AddUint64(e.stats.BytesEvicted, st.Size)
	if e.cfg.OnEvict != nil {
		e.cfg.OnEvict(Victim{Tensor: st.Root, Action: Swap, Size: st.Size}, ReasonPark)
	}
	return true, nil
}
