// Package recompute holds the lineage of a computation for Dynamic Tensor
// Rematerialization: ops (inputs, outputs, measured cost), the tensors they
// produce, and the storages (memory blocks) those tensors live in, with each
// storage's residency state, lock and pin counts, references and last access.
// It builds rematerialization plans (the ordered ops that rebuild an evicted
// tensor, ancestors first, on an explicit stack), keeps union-find classes of
// evicted storages for the h_DTR^eq heuristic, parses the DTR trace format
// and builds traces of a running program.
//
// # What it is and is not
//
// The package is policy-free: which storage to evict, and when, is decided
// by package evict, which drives a Graph through the methods here and keeps
// the counts (bytes in use, costs of neighbourhoods) itself. The graph only
// records what happened and answers what it implies: whether a tensor can be
// read now, and what must run to make it readable. It never allocates or
// frees device memory and counts no bytes in use. A Graph is not safe for
// concurrent use.
//
// # Tensors, storages and ops
//
// A Tensor (graph.go) is one value: the output of an Op, or an external
// tensor (AddExternal: an input or parameter, Op = NoOp). A Storage is the
// memory block a root tensor owns and its views share. An op's output either
// gets fresh storage (OutSpec.Alias = -1) or is a view of one of the op's
// inputs (Alias = that input's index) and joins the input's storage.
// TensorID, StorageID and OpID are dense indices from 0, issued in order and
// never reused. A graph holds one Tensor, Storage and Op per op of a step
// in three flat arrays, so their sizes are the engine's memory per op: a
// storage's views are linked through the tensors (StorageTensors lists
// them), and fields are ordered so that nothing is padding (issue 32).
//
// A storage has a State: Resident (in device memory), Evicted (dropped,
// rebuilt by re-running ops), Swapped (copied to host, copied back on
// demand) or Released (gone for good: nothing can ever need it). A tensor
// has its own Defined bit: dropping or releasing a storage undefines every
// tensor in it, and re-running an op defines its outputs again, so the root
// comes back with its op and each view with the op that made it. A tensor
// can be read (IsResident) when it is defined and its storage resident.
//
// Storage.Compute is the summed cost of the distinct ops that produced the
// storage's tensors: what re-running them costs once their inputs are
// resident. NoRecompute marks a storage that re-running cannot rebuild (an
// external tensor, the output of an op flagged NoRecompute, a value
// overwritten in place). Refs counts the program's references (the sum over
// the storage's tensors), Locks the holders that need it resident now, Pins
// those that need it resident for good; the graph stores them, package evict
// maintains them.
//
// Storages are linked by the ops between them: every distinct input storage
// of an op is a Parent of every distinct output storage, and that one its
// Child, once per op and never to itself (AddOp, link). LiveChildren counts
// the children that are not Released; AddOp increments it, and the code that
// releases a storage (evict's banish) decrements it on the parents.
//
// The state changes are Drop, SwapOut, SwapIn, Release and Rerun. Rerun
// checks that every input of the op is resident, makes its outputs resident
// and defined, and reports which storages came back (so the caller can count
// their bytes) and how many bytes of throw-away copies it made: outputs that
// were resident already, or whose storage was released for good.
//
// Pointers returned by Tensor, Storage and Op stay valid until the next call
// that adds tensors, storages or ops.
//
// # Plans
//
// Plan (plan.go) returns the Steps that make a tensor resident: evicted
// ancestors first, so that every input of a step is resident when it runs,
// counting the steps before it; each op once, a multi-output op bringing all
// its outputs back in one step; a swapped storage as a StepSwapIn. It is a
// depth-first walk on an explicit stack (a chain of any depth is planned
// without growing the goroutine stack), with per-op and per-storage stamps
// instead of visited sets, and changes nothing. A tensor that cannot be
// rebuilt (released, an external tensor that was dropped, an op that cannot
// be re-run and whose value was lost) fails with ErrNotRecomputable, naming
// the tensor. The values of StepKind are the C ABI's kinds.
//
// # Classes
//
// Classes (classes.go) is a union-find forest whose classes carry a cost,
// summed at the root: evict's eqTracker gives every evicted storage a node,
// merges it with the classes of its evicted neighbours, and subtracts a
// storage's cost when it comes back, to approximate the cost of an evicted
// neighbourhood (h_DTR^eq) without walking it.
//
// # The trace format
//
// A DTR trace (trace.go; the format of the DTR authors' simulator) is one
// JSON object per line, its kind in "INSTRUCTION":
//
//	CONSTANT  NAME                        an external tensor, followed by a
//	                                      MEMORY line (NAME, MEMORY: bytes)
//	CALL      NAME, ARGS, RESULT, TIME    an op: input names, result names and
//	                                      its cost in ns, followed by a MEMORY
//	                                      and an ALIAS line (ALIAS: -1 or the
//	                                      argument index viewed) per result
//	MUTATE    NAME, ARGS, MUTATE, TIME    an in-place op: the argument indices
//	                                      it overwrote get new versions
//	COPY      DST, SRC                    a new name for a tensor (a reference)
//	COPY_FROM DST, SRC                    DST now names SRC's tensor
//	RELEASE   NAME                        a name dropped (a reference)
//	ANNOTATE  ANNOTATION                  START (replay from here), BACKWARD
//
// Numbers may be JSON numbers or strings. The parser lowers the lines to
// Instrs: names resolve to trace tensor numbers (0, 1, 2, ... in order of
// creation; MUTATE versions are named after the argument with a "$"), the
// MEMORY and ALIAS lines fold into their CONSTANT or CALL, and reference
// counts are checked (a name used after its last release is an error). A
// Trace is the lowered instructions from START on, the names, and its
// Outputs: the tensors still referenced at the end, which must be resident
// then. Parse streams the instructions, ReadTrace keeps them (packed:
// packed.go, read back by Trace.At and Trace.All); a malformed
// line is a *ParseError naming the line and the reason. LoadTrace and
// DecodeTrace (file.go) read a file or stream, gunzipping it when it starts
// with gzip's magic bytes.
//
// # The builder
//
// A Builder (builder.go) assembles a Trace the way a program runs, call by
// call (Constant, Call, Mutate, Copy, Release, Pin), checking tensor numbers
// and references as the parser does. It is how a running engine records the
// step it executes (evict's Recording) so that package autotune can replay
// it under other configurations. KindPin, which the text format has no line
// for, keeps a tensor resident from there on.
//
// # Files
//
//	doc.go      this overview
//	graph.go    Graph, Tensor, Storage, Op, states, AddExternal, AddOp and the
//	            state changes
//	plan.go     Step, Plan
//	classes.go  Classes (union-find with costs)
//	trace.go    the trace format: Instr, Trace, Parse, ReadTrace
//	packed.go   how a Trace holds its instructions: Len, At, All, Append
//	file.go     LoadTrace, DecodeTrace (gzip)
//	builder.go  Builder, KindPin
package recompute
