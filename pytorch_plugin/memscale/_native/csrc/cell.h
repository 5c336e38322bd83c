// What the native region keeps per tensor, per storage and per recorded op.
//
// A *cell* is one engine tensor: its id, the id of the storage it lives in
// (its root), the op that made it, its geometry, and its real tensor while
// that storage is resident. A *group* is one storage and every cell on it
// (views share their base's storage: they are evicted, swapped and rebuilt
// with it). A *recorded op* is how to run an op again: the operator, its
// arguments with each tensor replaced by the cell it read, and the generator
// state it ran with. The C++ twins of memscale/_region/cells.py.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Storage.h>
#include <c10/core/UndefinedTensorImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Optional.h>
#include <c10/util/intrusive_ptr.h>

namespace memscale {

class Session;

// Tensor implementations as at::Tensor holds them (undefined = UndefinedTensorImpl).
using ImplPtr = c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

// Copies geometry only (for cells made on another cell's view).
struct Cell;

struct Cell : c10::intrusive_ptr_target {
  int64_t id;    // the engine's tensor id (-1 once detached from its session)
  int64_t root;  // the id of the storage it lives in
  int64_t op;    // the op that made it (-1: an external)
  // Geometry, to re-derive the tensor from its storage after a rebuild.
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset = 0;
  caffe2::TypeMeta dtype;
  c10::Device device{c10::kCPU};
  bool conj = false;
  bool neg = false;
  // The real tensor while the storage is resident and the view derived.
  at::Tensor tensor;
  bool pinned = false;    // never evicted (externals, their aliases and versions)
  bool released = false;  // no wrapper or external names it any more
  bool consumed = false;  // a recorded op read it (a pinned one is copied on write)
  bool external = false;  // a plain tensor of the program names it (Session's externals)
  // A wrapper's data pointer or storage was taken (Session::expose): locked in
  // the engine until released, as raw pointers into it may outlive the op.
  bool exposed = false;
  // A leaf's accumulated gradient, pinned in the engine (Session::pin_gradient).
  bool grad_pinned = false;
  // Wrappers naming this cell; the last one to die queues its release.
  std::atomic<int> wrappers{0};
  // The latest wrapper made for it (to repoint it after an in-place op, and
  // to hand it back as a plain tensor at the exit).
  c10::optional<WeakImpl> wrapper;
  // Every other wrapper made for it (shallow copies: autograd's saved outputs,
  // .data), so an in-place op's new version is named by all of them.
  std::vector<WeakImpl> others;
  // The session while the cell belongs to an open one, else null.
  std::atomic<Session*> session{nullptr};

  // A cell with its geometry to be filled in.
  Cell(int64_t id_, int64_t root_, int64_t op_) : id(id_), root(root_), op(op_) {}
  // A cell with `real`'s geometry and data.
  Cell(int64_t id_, int64_t root_, int64_t op_, const at::Tensor& real)
      : id(id_), root(root_), op(op_), dtype(real.dtype()), device(real.device()) {
    auto s = real.sizes();
    auto st = real.strides();
    sizes.assign(s.begin(), s.end());
    strides.assign(st.begin(), st.end());
    offset = real.storage_offset();
    conj = real.is_conj();
    neg = real.is_neg();
    tensor = real;
  }
};

using CellPtr = c10::intrusive_ptr<Cell>;
// The cells an op's results became (most ops return one or two tensors: no allocation then).
using CellList = c10::SmallVector<CellPtr, 2>;

// One storage and the cells on it.
struct Group {
  c10::Storage storage;      // null while evicted (dropped or swapped out)
  at::Tensor host;           // the swapped-out copy (bytes), while swapped
  int64_t nbytes = 0;
  int live = 0;              // cells on it not released
  c10::SmallVector<CellPtr, 2> cells;  // most storages hold one tensor (no allocation then)

  bool resident() const { return storage.unsafeGetStorageImpl() != nullptr; }
};

// Where a tensor argument sits: argument position, element of a list (or -1),
// and which of the op's input cells it is.
struct Slot {
  int arg;
  int elem;
  int input;
};

// How a recorded op is re-run.
enum class RerunKind : uint8_t {
  kCall,      // run the op again; its fresh outputs are the results
  kMutation,  // run the in-place op on copies of the old versions it wrote
  kView,      // nothing to run: a view re-derived from its base's storage
};

// Small vectors: one is recorded per op, most read and make a few tensors.
struct RecordedOp {
  c10::OperatorHandle op;
  c10::SmallVector<c10::IValue, 4> args;  // tensors left undefined: the slots say which cell
  c10::SmallVector<Slot, 4> slots;
  c10::SmallVector<CellPtr, 3> inputs;
  c10::SmallVector<CellPtr, 2> outputs;   // per registered result, in order
  RerunKind kind = RerunKind::kCall;
  std::vector<int> mutated;        // kMutation: inputs written, one per new version
  std::vector<int> scratch;        // argument positions written that a re-run gets copies of
  at::Tensor rng_state;            // seeded ops: the generator's state before the first run
  c10::optional<at::Generator> generator;
  // For a shape-only op: the geometry of the `self` stand-in.
  bool shape_only = false;
  int64_t fresh_bytes = 0;         // what a re-run allocates
  bool grad_mode = false;          // the grad mode of the first run (kernels read it: mkldnn_rnn_layer)
  // Arguments (bit i: position i) that were Python numbers passed where a
  // tensor goes (y + 1.0): kept as the number, made a wrapped-number tensor
  // again at a re-run - so a record keeps no tensor alive but its cells'.
  // Positions from kNumberArgs on keep their tensor.
  static constexpr size_t kNumberArgs = 32;
  uint32_t numbers = 0;

  explicit RecordedOp(const c10::OperatorHandle& op_) : op(op_) {}
};

}  // namespace memscale
