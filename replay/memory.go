package replay

import (
	"errors"
	"fmt"

	"github.com/memscale/memscale/evict"
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
	// Alloc places size bytes.
	Alloc(size uint64) (Block, error)
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
func (Counting) Alloc(uint64) (Block, error) { return 0, nil }

// Free implements MemoryModel.
func (Counting) Free(Block) error { return nil }

// Peak implements MemoryModel (the engine reports the peak).
func (Counting) Peak() uint64 { return 0 }

// placed gives the storage rooted at t a block (non-counting models).
func (r *runner) placed(t rc.TensorID, size uint64) error {
	if r.counter {
		return nil
	}
	for int(t) >= len(r.blocks) {
		r.blocks = append(r.blocks, 0)
	}
	for {
		b, err := r.mem.Alloc(size)
		if err == nil {
			r.blocks[t] = b + 1 // 0 = no block
			return nil
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

// placeOutputs gives blocks to the storages a re-run brought back.
func (r *runner) placeOutputs(op rc.OpID) error {
	g := r.eng.Graph()
	for _, out := range g.Op(op).Outputs {
		x := g.Tensor(out)
		if x.Alias >= 0 {
			continue
		}
		root := g.Storage(x.Storage).Root
		if int(root) < len(r.blocks) && r.blocks[root] != 0 {
			continue // was resident: the re-run's copy is thrown away
		}
		if err := r.placed(root, g.Storage(x.Storage).Size); err != nil {
			return err
		}
	}
	return nil
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
			n += st.Size
		}
	}
	if n != r.eng.ResidentBytes() {
		return fmt.Errorf("engine counts %d resident bytes, storages hold %d", r.eng.ResidentBytes(), n)
	}
	return nil
}
