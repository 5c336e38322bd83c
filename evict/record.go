package evict

import (
	"errors"
	"fmt"

	rc "github.com/memscale/memscale/recompute"
)

// errNotRecording is what Recording returns for an engine created without
// Config.Record.
var errNotRecording = errors.New("evict: this engine does not record its program (Config.Record is off)")

// MaxRecordedInstructions bounds a recording (about 150 bytes each): an
// engine that lives longer than a step (a region entered once for a whole
// training run) stops recording there and frees what it kept, and Recording
// says so, instead of growing without end.
const MaxRecordedInstructions = 1 << 20

// recorder keeps, for an engine created with Config.Record, the program it
// was told about as a trace: external tensors, ops, in-place ops, new
// references, releases and pins, in order, with the measured costs. What the
// engine itself does (evictions, rebuilds) is not recorded: a replay of the
// recording under another policy makes its own. Tensor IDs are dense, so
// the map from engine tensors to trace numbers is a slice.
type recorder struct {
	b       rc.Builder
	ids     []int32 // rc.TensorID -> trace tensor number
	args    []int32 // nums' result, reused (the builder copies it)
	limit   int     // MaxRecordedInstructions (tests lower it)
	err     error   // the first inconsistency; recording stopped there
	stopped int     // instructions recorded when it stopped
}

func (r *recorder) bind(t rc.TensorID, n int32) {
	for int64(len(r.ids)) <= int64(t) {
		r.ids = append(r.ids, -1)
	}
	r.ids[t] = n
}

func (r *recorder) num(t rc.TensorID) int32 {
	if t < 0 || int64(t) >= int64(len(r.ids)) {
		return -1
	}
	return r.ids[t]
}

// nums maps op inputs to trace numbers, in a buffer reused by the next call.
func (r *recorder) nums(ts []rc.TensorID) []int32 {
	r.args = r.args[:0]
	for _, t := range ts {
		r.args = append(r.args, r.num(t))
	}
	return r.args
}

// bindAll maps an op's outputs ids to the trace numbers the builder gave
// them, or stops the recording at the builder's error.
func (r *recorder) bindAll(ids []rc.TensorID, got []int32, err error) {
	if err != nil {
		r.fail(err)
		return
	}
	for i, t := range ids {
		r.bind(t, got[i])
	}
	r.fail(nil)
}

// fail stops the recording at its first error, or when it is full.
func (r *recorder) fail(err error) {
	if r.err == nil && err == nil && r.b.Len() >= r.limit {
		err = fmt.Errorf("the program is longer than %d instructions (MaxRecordedInstructions); a step that long is not tuned", r.limit)
	}
	if r.err == nil && err != nil {
		r.err, r.stopped = err, r.b.Len()
		r.b, r.ids = rc.Builder{}, nil // keep nothing that can no longer be used
	}
}

func (e *Engine) recConstant(t rc.TensorID, size uint64) {
	if r := e.rec; r != nil && r.err == nil {
		r.bind(t, r.b.Constant(size))
		r.fail(nil)
	}
}

func (e *Engine) recCall(name string, inputs []rc.TensorID, outs []Output, cost int64, ids []rc.TensorID) {
	r := e.rec
	if r == nil || r.err != nil {
		return
	}
	got, err := r.b.Call(name, r.nums(inputs), outs, cost)
	r.bindAll(ids, got, err)
}

func (e *Engine) recMutate(name string, inputs []rc.TensorID, mutated []int, cost int64, ids []rc.TensorID) {
	r := e.rec
	if r == nil || r.err != nil {
		return
	}
	got, err := r.b.Mutate(name, r.nums(inputs), mutated, cost)
	r.bindAll(ids, got, err)
}

// recRef records Retain (copy), Release or Pin of t.
func (e *Engine) recRef(kind rc.Kind, t rc.TensorID) {
	r := e.rec
	if r == nil || r.err != nil {
		return
	}
	n := r.num(t)
	switch kind {
	case rc.KindCopy:
		r.fail(r.b.Copy(n))
	case rc.KindRelease:
		r.fail(r.b.Release(n))
	case rc.KindPin:
		r.fail(r.b.Pin(n))
	}
}

// Recording returns the program the engine has been told about so far, as
// a trace that package replay can run under any budget and configuration:
// every NewTensor is a CONSTANT (an unpinned external tensor, which can only
// be swapped, is replayed as a pinned one), every Call a CALL, every Mutate a
// MUTATE, every Retain a COPY, every Release a RELEASE and every Pin a PIN;
// the tensors still referenced are its outputs. It fails for an engine
// created without Config.Record, or when the program did something the
// recording could not follow (the error says what; the engine itself was
// not affected).
func (e *Engine) Recording() (*rc.Trace, error) {
	if e.rec == nil {
		return nil, errNotRecording
	}
	if e.rec.err != nil {
		return nil, fmt.Errorf("evict: recording stopped after %d instructions: %w", e.rec.stopped, e.rec.err)
	}
	return e.rec.b.Trace(), nil
}
