// The lineage graph: tensors, storages, ops and their states. See doc.go
// for the design.

package recompute

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/memscale/memscale/internal/satmath"
)

// TensorID identifies a tensor: one value produced by an op or registered
// from outside. IDs are dense, starting at 0.
type TensorID int64

// OpID identifies an op. IDs are dense, starting at 0.
type OpID int64

// StorageID identifies a storage: the memory block one tensor (its root) and
// every view of it share. IDs are dense, starting at 0.
type StorageID int32

// NoOp is the producing op of an external tensor (an input or parameter).
const NoOp OpID = -1

// State is the residency of a storage.
type State uint8

// Storage states.
const (
	// Resident: the storage is in device memory.
	Resident State = iota
	// Evicted: the storage was dropped; its tensors are rebuilt by re-running
	// the ops that produced them.
	Evicted
	// Swapped: the storage was copied to host memory and is copied back on
	// demand.
	Swapped
	// Released: nothing can ever need the storage again (no references, every
	// dependent released); it is gone for good.
	Released
)

// String names the state.
func (s State) String() string {
	switch s {
	case Resident:
		return "resident"
	case Evicted:
		return "evicted"
	case Swapped:
		return "swapped"
	case Released:
		return "released"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// OpFlags are properties of an op.
type OpFlags uint32

// Op flags.
const (
	// NoRecompute marks an op that cannot be replayed (RNG, collectives,
	// in-place on an external buffer): its outputs are never dropped, only
	// swapped.
	NoRecompute OpFlags = 1 << iota
)

// Op is one recorded op.
type Op struct {
	// Name is the op's name (for messages).
	Name string
	// Inputs are the tensors the op read, in argument order.
	Inputs []TensorID
	// Outputs are the tensors the op produced.
	Outputs []TensorID
	// Cost is the op's measured cost in nanoseconds (the last measurement).
	Cost int64
	// Flags are the op's properties.
	Flags OpFlags
}

// Tensor is one value in the lineage graph.
type Tensor struct {
	// Op produced the tensor (NoOp for an external tensor).
	Op OpID
	// Index is the tensor's output position in Op.
	Index int32
	// Alias is -1 when the tensor has storage of its own, otherwise the index
	// of the input of Op whose storage it shares (a view).
	Alias int32
	// Storage is where the tensor's data lives.
	Storage StorageID
	// Defined reports whether the tensor's value is available in its storage.
	// Dropping a storage undefines all its tensors; re-running the root's op
	// defines the root again, and each view is defined again by re-running
	// the op that made it.
	Defined bool
	// Refs counts the program's references to the tensor.
	Refs int32
	// nextView links the views of a storage (Storage.views): the next
	// one's TensorID+1, 0 at the end. It fits the padding after Refs.
	nextView int32
}

// Storage is a block of memory shared by a root tensor and its views. Its
// fields are ordered by size so that it packs in 112 bytes (a graph holds
// one per op of a step: issue 32); its views are a list threaded through
// the tensors (Graph.StorageTensors), not a slice of its own.
type Storage struct {
	// Root is the tensor that owns the storage.
	Root TensorID
	// Size is the storage's size in bytes.
	Size uint64
	// LastAccess is the clock value at the storage's last use.
	LastAccess int64
	// Compute is the summed cost of the distinct ops that produced Tensors:
	// what re-running them costs once the inputs are resident.
	Compute int64
	// Parents are the storages read by the ops that produced Tensors
	// (excluding this storage), once per op.
	Parents []StorageID
	// Children are the storages produced by ops that read Tensors (excluding
	// this storage), once per op. Parents and Children mirror each other.
	Children []StorageID
	// Locks counts holders that need the storage resident right now.
	Locks int32
	// Pins counts holders that need the storage resident forever.
	Pins int32
	// Refs is the sum of Refs over Tensors.
	Refs int32
	// LiveChildren counts the entries of Children that are not Released.
	LiveChildren int32
	// State is the storage's residency.
	State State
	// NoRecompute is set when the root cannot be rebuilt by re-running an op
	// (an external tensor, a NoRecompute op, or a storage overwritten in
	// place whose value is lost).
	NoRecompute bool
	// views is the most recently added view's TensorID+1 (0: none); each
	// view's Tensor.nextView names the one added before it.
	views int32

	stamp uint64 // scratch mark for traversals
}

// OutSpec describes one output of an op being added.
type OutSpec struct {
	// Size is the size in bytes of a fresh output (ignored for a view).
	Size uint64
	// Alias is -1 for fresh storage, or the index of the input whose storage
	// the output shares.
	Alias int32
}

// Graph is the lineage graph.
type Graph struct {
	tensors  []Tensor
	storages []Storage
	ops      []Op
	epoch    uint64
	opStamp  []uint64
	swapped  uint64 // bytes of the storages in state Swapped
	live     uint64 // bytes of the storages not Released (at most MaxLiveBytes)

	tensorIDs  idArena[TensorID]  // ops' Inputs and Outputs
	storageIDs idArena[StorageID] // storages' first Parents and Children
}

// MaxSize is the largest storage the graph accepts, in bytes: 256 TiB, the
// largest request the allocator accepts (allocator.MaxSize) and beyond any
// device. A larger size is a corrupt trace or a caller's bug.
const MaxSize = 1 << 48

// MaxLiveBytes bounds the summed size of the storages that are not released
// (2^62 bytes): every byte count of the engine (usage, its peak, the pinned
// and locked totals) is a sum over a subset of them, so none of those sums
// can wrap around a uint64.
const MaxLiveBytes = 1 << 62

// MaxTensors bounds the tensors of a graph (2^31-2): a storage's views
// are linked by 32-bit numbers. At 32 bytes a tensor that is 64 GiB of
// tensors alone, beyond any step.
const MaxTensors = math.MaxInt32 - 1

// checkTensors returns an error naming what unless n more tensors fit.
func (g *Graph) checkTensors(n int) error {
	if len(g.tensors)+n > MaxTensors {
		return fmt.Errorf("%d tensors already, the most a graph holds is %d: %w", len(g.tensors), MaxTensors, ErrTooLarge)
	}
	return nil
}

// ErrTooLarge is wrapped by the errors of AddExternal and AddOp for a size
// above MaxSize or storages above MaxLiveBytes in all.
var ErrTooLarge = errors.New("size too large")

// checkSize returns an error naming its size and the limits unless a fresh
// storage of size bytes is accepted now. The caller adds what the storage is
// (on the error path only: AddOp runs once per op of a step).
func (g *Graph) checkSize(size, more uint64) error {
	if size > MaxSize {
		return fmt.Errorf("size %d bytes is above the maximum of %d bytes (256 TiB): %w", size, uint64(MaxSize), ErrTooLarge)
	}
	if g.live+more > MaxLiveBytes {
		return fmt.Errorf("%d more bytes would take the live storages to %d bytes, above the maximum of %d bytes: %w",
			size, g.live+more, uint64(MaxLiveBytes), ErrTooLarge)
	}
	return nil
}

// LiveBytes returns the summed size of the storages not released.
func (g *Graph) LiveBytes() uint64 { return g.live }

// ErrUnknownTensor reports a tensor id the graph never issued.
var ErrUnknownTensor = errors.New("unknown tensor")

// ErrUnknownOp reports an op id the graph never issued.
var ErrUnknownOp = errors.New("unknown op")

// NewGraph returns an empty graph.
func NewGraph() *Graph { return &Graph{} }

// Reserve makes room for ops, tensors and storages more of each, so that
// issuing them does not grow (and copy) the graph's arrays. A DTR region's
// next step repeats its program: reserving the counts of the last one saves
// the copies growth makes (a quarter of an op's registration time). Counts
// of zero or less reserve nothing.
func (g *Graph) Reserve(ops, tensors, storages int) {
	if ops > 0 {
		g.ops = slices.Grow(g.ops, ops)
		g.opStamp = slices.Grow(g.opStamp, ops)
	}
	if tensors > 0 {
		g.tensors = slices.Grow(g.tensors, tensors)
	}
	if storages > 0 {
		g.storages = slices.Grow(g.storages, storages)
	}
}

// NumTensors returns the number of tensors issued.
func (g *Graph) NumTensors() int { return len(g.tensors) }

// NumStorages returns the number of storages issued.
func (g *Graph) NumStorages() int { return len(g.storages) }

// NumOps returns the number of ops issued.
func (g *Graph) NumOps() int { return len(g.ops) }

// Tensor returns tensor t. The pointer is valid until the next call that adds
// tensors; callers outside this package treat it as read-only except where
// the evict package documents otherwise.
func (g *Graph) Tensor(t TensorID) *Tensor { return &g.tensors[t] }

// Storage returns storage s (same validity rules as Tensor).
func (g *Graph) Storage(s StorageID) *Storage { return &g.storages[s] }

// Op returns op o (same validity rules as Tensor).
func (g *Graph) Op(o OpID) *Op { return &g.ops[o] }

// StorageOf returns the storage of tensor t.
func (g *Graph) StorageOf(t TensorID) *Storage { return &g.storages[g.tensors[t].Storage] }

// CheckTensor returns an error unless t was issued by the graph.
func (g *Graph) CheckTensor(t TensorID) error {
	if t < 0 || int64(t) >= int64(len(g.tensors)) {
		return fmt.Errorf("tensor %d: %w (have %d)", t, ErrUnknownTensor, len(g.tensors))
	}
	return nil
}

// CheckOp returns an error unless o was issued by the graph.
func (g *Graph) CheckOp(o OpID) error {
	if o < 0 || int64(o) >= int64(len(g.ops)) {
		return fmt.Errorf("op %d: %w (have %d)", o, ErrUnknownOp, len(g.ops))
	}
	return nil
}

// IsResident reports whether tensor t can be read now: it is defined and its
// storage is in device memory.
func (g *Graph) IsResident(t TensorID) bool {
	x := &g.tensors[t]
	return x.Defined && g.storages[x.Storage].State == Resident
}

// AddExternal registers a tensor that no recorded op produced (an input or a
// parameter), resident in a storage of its own, with one reference. A size
// above MaxSize, or one that takes the live storages above MaxLiveBytes, is
// an error wrapping ErrTooLarge.
func (g *Graph) AddExternal(size uint64, clock int64) (TensorID, error) {
	if err := g.checkSize(size, size); err != nil {
		return 0, fmt.Errorf("external tensor: %w", err)
	}
	if err := g.checkTensors(1); err != nil {
		return 0, fmt.Errorf("external tensor: %w", err)
	}
	g.live += size
	t := TensorID(len(g.tensors))
	s := StorageID(len(g.storages))
	g.storages = append(g.storages, Storage{
		Root: t, Size: size, State: Resident,
		Refs: 1, LastAccess: clock, NoRecompute: true,
	})
	g.tensors = append(g.tensors, Tensor{Op: NoOp, Alias: -1, Storage: s, Defined: true, Refs: 1})
	return t, nil
}

// AddOp records an op that ran: it read inputs (which must all be resident)
// and produced one output per spec, each defined, resident and holding one
// reference. Fresh outputs get storages of their own; views share the storage
// of the input they alias. It returns the op's id; the outputs are
// Op(id).Outputs. A fresh output above MaxSize, or outputs that take the live
// storages above MaxLiveBytes, are an error wrapping ErrTooLarge; the op's
// cost is added to its outputs' Compute saturating at math.MaxInt64.
func (g *Graph) AddOp(name string, inputs []TensorID, outs []OutSpec, cost int64, flags OpFlags, clock int64) (OpID, error) {
	if cost < 0 {
		return 0, fmt.Errorf("op %s: negative cost %d", name, cost)
	}
	for i, in := range inputs {
		if err := g.CheckTensor(in); err != nil {
			return 0, fmt.Errorf("op %s input %d: %w", name, i, err)
		}
		if !g.IsResident(in) {
			x := &g.tensors[in]
			return 0, fmt.Errorf("op %s input %d: tensor %d is not resident (storage %s, defined=%v)",
				name, i, in, g.storages[x.Storage].State, x.Defined)
		}
	}
	if err := g.checkTensors(len(outs)); err != nil {
		return 0, fmt.Errorf("op %s: %w", name, err)
	}
	var fresh uint64
	for i, o := range outs {
		if o.Alias < -1 || int(o.Alias) >= len(inputs) {
			return 0, fmt.Errorf("op %s output %d: alias %d out of range (%d inputs)", name, i, o.Alias, len(inputs))
		}
		if o.Alias < 0 {
			// checkSize refuses o.Size > MaxSize before it looks at the
			// sum, and fresh passed the check before (<= MaxLiveBytes),
			// so neither fresh+o.Size nor live+fresh+o.Size can wrap
			if err := g.checkSize(o.Size, fresh+o.Size); err != nil {
				return 0, fmt.Errorf("op %s output %d: %w", name, i, err)
			}
			fresh += o.Size
		}
	}
	g.live += fresh
	id := OpID(len(g.ops))
	op := Op{Name: name, Inputs: g.tensorIDs.clone(inputs), Cost: cost, Flags: flags}
	op.Outputs = g.tensorIDs.take(len(outs))
	g.epoch++
	for i, o := range outs {
		t := TensorID(len(g.tensors))
		op.Outputs[i] = t
		var sid StorageID
		if o.Alias < 0 {
			sid = StorageID(len(g.storages))
			g.storages = append(g.storages, Storage{
				Root: t, Size: o.Size, State: Resident, LastAccess: clock,
				NoRecompute: flags&NoRecompute != 0,
			})
		} else {
			sid = g.tensors[inputs[o.Alias]].Storage
		}
		s := &g.storages[sid]
		var next int32
		if o.Alias >= 0 {
			next, s.views = s.views, int32(t)+1
		}
		s.Refs++
		if s.stamp != g.epoch {
			// first output of this op in s: the op's cost is part of
			// rebuilding s.
			s.stamp = g.epoch
			s.Compute = satmath.AddInt64(s.Compute, cost)
		}
		g.tensors = append(g.tensors, Tensor{Op: id, Index: int32(i), Alias: o.Alias, Storage: sid, Defined: true, Refs: 1, nextView: next})
	}
	g.ops = append(g.ops, op)
	g.opStamp = append(g.opStamp, 0)
	g.link(id)
	return id, nil
}

// link adds the storage edges of op id: every distinct input storage is a
// parent of every distinct output storage (once per op, never a self edge).
func (g *Graph) link(id OpID) {
	op := &g.ops[id]
	var inBuf, outBuf [8]StorageID
	ins := distinctStorages(g, op.Inputs, inBuf[:0])
	outs := distinctStorages(g, op.Outputs, outBuf[:0])
	for _, ps := range ins {
		for _, cs := range outs {
			if cs == ps {
				continue
			}
			p, c := &g.storages[ps], &g.storages[cs]
			p.Children = g.storageIDs.appendTo(p.Children, cs)
			p.LiveChildren++
			c.Parents = g.storageIDs.appendTo(c.Parents, ps)
		}
	}
}

func distinctStorages(g *Graph, ts []TensorID, buf []StorageID) []StorageID {
outer:
	for _, t := range ts {
		s := g.tensors[t].Storage
		for _, x := range buf {
			if x == s {
				continue outer
			}
		}
		buf = append(buf, s)
	}
	return buf
}

// Drop evicts storage s: it leaves device memory and all its tensors become
// undefined. The caller accounts for the freed bytes.
func (g *Graph) Drop(s StorageID) {
	st := &g.storages[s]
	g.leave(st)
	st.State = Evicted
	g.undefine(st)
}

// undefine marks the root and every view of st undefined.
func (g *Graph) undefine(st *Storage) {
	g.tensors[st.Root].Defined = false
	for v := st.views; v != 0; v = g.tensors[v-1].nextView {
		g.tensors[v-1].Defined = false
	}
}

// StorageTensors appends to buf the tensors of storage s, the root first,
// then its views in the order they were made, and returns it.
func (g *Graph) StorageTensors(s StorageID, buf []TensorID) []TensorID {
	st := &g.storages[s]
	buf = append(buf, st.Root)
	n := len(buf)
	for v := st.views; v != 0; v = g.tensors[v-1].nextView {
		buf = append(buf, TensorID(v-1))
	}
	slices.Reverse(buf[n:])
	return buf
}

// SwapOut moves storage s to host memory; its tensors keep their values.
func (g *Graph) SwapOut(s StorageID) {
	st := &g.storages[s]
	if st.State != Swapped {
		g.swapped += st.Size
	}
	st.State = Swapped
}

// SwapIn brings a swapped storage back into device memory.
func (g *Graph) SwapIn(s StorageID) {
	st := &g.storages[s]
	g.leave(st)
	st.State = Resident
}

// SwappedBytes returns the bytes of the storages swapped out to host memory now.
func (g *Graph) SwappedBytes() uint64 { return g.swapped }

// leave accounts for st leaving its current state (its host bytes when swapped).
func (g *Graph) leave(st *Storage) {
	if st.State == Swapped {
		g.swapped -= st.Size
	}
}

// Release marks storage s as gone for good.
func (g *Graph) Release(s StorageID) {
	st := &g.storages[s]
	g.leave(st)
	if st.State != Released {
		g.live -= st.Size
	}
	st.State = Released
	g.undefine(st)
}

// Rerun records that op o ran again. All its inputs must be resident. Every
// output becomes defined and resident, except one whose storage was released
// for good (a multi-output op whose other output the program dropped): it
// stays released and the re-run's copy of it is thrown away. newly receives
// each storage that was not resident before (so the caller can account for
// its bytes); dup is the bytes of the fresh outputs the op produced a
// throw-away copy of (resident already, or released).
func (g *Graph) Rerun(o OpID, newly []StorageID) (added []StorageID, dup uint64, err error) {
	if err := g.CheckOp(o); err != nil {
		return newly, 0, err
	}
	op := &g.ops[o]
	for i, in := range op.Inputs {
		if !g.IsResident(in) {
			x := &g.tensors[in]
			return newly, 0, fmt.Errorf("re-run of op %d (%s): input %d tensor %d is not resident (storage %s, defined=%v)",
				o, op.Name, i, in, g.storages[x.Storage].State, x.Defined)
		}
	}
	for _, out := range op.Outputs {
		x := &g.tensors[out]
		s := &g.storages[x.Storage]
		if s.State == Released {
			if x.Alias < 0 {
				dup += s.Size
			}
			continue
		}
		if x.Alias < 0 {
			switch {
			case s.State == Resident && x.Defined:
				dup += s.Size
			case s.State != Resident:
				g.leave(s)
				s.State = Resident
				newly = append(newly, x.Storage)
			}
		}
		x.Defined = true
	}
	return newly, dup, nil
}

// FreshSize returns the bytes an op allocates when it runs: the sum of its
// fresh (non-view) outputs' sizes.
func (g *Graph) FreshSize(o OpID) uint64 {
	var n uint64
	for _, out := range g.ops[o].Outputs {
		if x := &g.tensors[out]; x.Alias < 0 {
			n += g.storages[x.Storage].Size
		}
	}
	return n
}

// Mark starts a new traversal and returns its stamp; Marked and SetMark use
// it to remember visited storages without allocating.
func (g *Graph) Mark() uint64 {
	g.epoch++
	return g.epoch
}

// Marked reports whether storage s carries stamp m.
func (g *Graph) Marked(s StorageID, m uint64) bool { return g.storages[s].stamp == m }

// SetMark stamps storage s with m.
func (g *Graph) SetMark(s StorageID, m uint64) { g.storages[s].stamp = m }
