package replay

import (
	"errors"
	"fmt"

	"github.com/memscale/memscale/evict"
	"github.com/memscale/memscale/internal/satmath"
	rc "github.com/memscale/memscale/recompute"
)

// Block is a memory model's handle for one placed storage.
type Block uint64

// ErrNoRoom is returned (wrapped) by MemoryModel.Alloc when a block does not
// fit now; the replay then evicts one more victim and tries again.
var ErrNoRoom = errors.New("no room")

// MemoryModel decides where storages live during a replay. Counting only
// adds bytes (the engine's own count enforces the budget, as in the DTR
// authors' simulator); other models place every storage in a real allocator
// whose hard limit is the budget, so fragmentation shows.
type MemoryModel interface {
	// Name names the model in results.
	Name() string
	// UsageSource returns the engine's usage source, or nil to let the
	// engine count resident bytes.
	UsageSource() func() uint64
	// Alloc places size bytes. pinned says the storage is never evicted
	// nor freed before the run ends (a constant: a parameter or an input),
	// so a placing model can keep it apart from short-lived storages.
	Alloc(size uint64, pinned bool) (Block, error)
	// Free releases a block.
	Free(b Block) error
	// Peak returns the highest usage seen.
	Peak() uint64
}

// Counting is the byte-counting memory model.
type Counting struct{}

// Name implements MemoryModel.
func (Counting) Name() string { return "counting" }

// UsageSource implements MemoryModel: the engine counts.
func (Counting) UsageSource() func() uint64 { return nil }

// Alloc implements MemoryModel; it always fits.
func (Counting) Alloc(uint64, bool) (Block, error) { return 0, nil }

// Free implements MemoryModel.
func (Counting) Free(Block) error { return nil }

// Peak implements MemoryModel (the engine reports the peak).
func (Counting) Peak() uint64 { return 0 }

// reserve places one block per size (non-counting models), before the
// storages they are for exist in the engine, so that the victims evicted to
// make them fit cannot be those storages. A block that does not fit makes
// the engine evict one more victim. pinned is passed to the model's Alloc
// (the blocks are for pinned storages). The blocks are left in r.reserved until
// the caller hands them to storages (take); if the run stops first, even
// half-way through the sizes, freeAll gives them back.
func (r *runner) reserve(pinned bool, sizes ...uint64) error {
	if len(r.reserved) > 0 {
		return fmt.Errorf("placing %d blocks: %d blocks of the previous placement were not handed to storages", len(sizes), len(r.reserved))
	}
	for _, size := range sizes {
		for {
			b, err := r.mem.Alloc(size, pinned)
			if err == nil {
				r.reserved = append(r.reserved, b)
				break
			}
			if !errors.Is(err, ErrNoRoom) {
				return fmt.Errorf("placing %d bytes: %w", size, err)
			}
			v, eerr := r.eng.EvictOne()
			if eerr != nil {
				return &errStop{status: OOM, err: fmt.Errorf("placing %d bytes: %w; %w", size, err, eerr)}
			}
			if err := r.freeVictims([]evict.Victim{v}); err != nil {
				return err
			}
		}
	}
	return nil
}

// take hands over the blocks of the last reserve: the caller now owns them
// (assigns them to storages or frees them). The returned slice is valid
// until the next reserve.
func (r *runner) take() []Block {
	b := r.reserved
	r.reserved = r.reserved[:0]
	return b
}

// assign records that the storage rooted at t lives in block b.
func (r *runner) assign(t rc.TensorID, b Block) {
	for int(t) >= len(r.blocks) {
		r.blocks = append(r.blocks, 0)
	}
	r.blocks[t] = b + 1 // 0 = no block
}

// rerunPlaced runs an engine re-run of op (target: the output it is for, or
// -1) with its outputs placed first: storages coming back get blocks, and
// outputs that are resident already, or released for good, get a block for
// the op's throw-away copy, freed right after.
func (r *runner) rerunPlaced(op rc.OpID, target rc.TensorID) error {
	if r.counter {
		return r.eng.RematerializedFor(op, target, -1)
	}
	g := r.eng.Graph()
	var sizes []uint64
	var roots []rc.TensorID // -1 for a throw-away copy
	for _, out := range g.Op(op).Outputs {
		x := g.Tensor(out)
		if x.Alias >= 0 {
			continue
		}
		st := g.Storage(x.Storage)
		sizes = append(sizes, st.Size)
		if (st.State == rc.Resident && x.Defined) || st.State == rc.Released {
			roots = append(roots, -1)
		} else {
			roots = append(roots, st.Root)
		}
	}
	if err := r.reserve(false, sizes...); err != nil {
		return err
	}
	if err := r.eng.RematerializedFor(op, target, -1); err != nil {
		return err
	}
	var errs []error
	for i, b := range r.take() {
		if roots[i] >= 0 {
			r.assign(roots[i], b)
		} else if err := r.mem.Free(b); err != nil {
			errs = append(errs, fmt.Errorf("freeing a re-run's duplicate output: %w", err))
		}
	}
	return errors.Join(errs...)
}

// freeAll gives back every block still placed when the run ends (the
// storages still resident, the program's outputs among them, and blocks
// placed for a step the run stopped before), so that the memory model ends
// empty: it can be reused, and closing it finds nothing live.
func (r *runner) freeAll() error {
	if r.counter {
		return nil
	}
	var errs []error
	for _, b := range r.take() {
		if err := r.mem.Free(b); err != nil {
			errs = append(errs, fmt.Errorf("freeing a block placed for a step that did not run: %w", err))
		}
	}
	for t, b := range r.blocks {
		if b != 0 {
			r.blocks[t] = 0
			if err := r.mem.Free(b - 1); err != nil {
				errs = append(errs, fmt.Errorf("freeing the storage of tensor %d: %w", t, err))
			}
		}
	}
	return errors.Join(errs...)
}

func (r *runner) freeVictims(vs []evict.Victim) error {
	if r.counter {
		return nil
	}
	for _, v := range vs {
		if int(v.Tensor) >= len(r.blocks) || r.blocks[v.Tensor] == 0 {
			continue
		}
		b := r.blocks[v.Tensor] - 1
		r.blocks[v.Tensor] = 0
		if err := r.mem.Free(b); err != nil {
			return fmt.Errorf("freeing the storage of tensor %d: %w", v.Tensor, err)
		}
	}
	return nil
}

// check verifies the replay invariants; full also recounts resident bytes.
func (r *runner) check(full bool) error {
	if b := r.opt.Budget; b > 0 && r.eng.Usage() > b {
		return fmt.Errorf("usage %d above budget %d", r.eng.Usage(), b)
	}
	if !full {
		return nil
	}
	g := r.eng.Graph()
	var n uint64
	for s := 0; s < g.NumStorages(); s++ {
		if st := g.Storage(rc.StorageID(s)); st.State == rc.Resident {
			n = satmath.AddUint64(n, st.Size)
		}
	}
	if n != r.eng.ResidentBytes() {
		return fmt.Errorf("engine counts %d resident bytes, storages hold %d", r.eng.ResidentBytes(), n)
	}
	return nil
}
