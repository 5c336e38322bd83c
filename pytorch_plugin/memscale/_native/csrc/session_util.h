// What several of the files defining Session's members share (internal to the
// native region, included by them only): the private nested types an op's
// path passes around (Inputs, Outputs, Held, Level) and the helpers on
// arguments' tensors and storages.
#pragma once

#include "arg_tensors.h"
#include "dispatch_key.h"
#include "session.h"

namespace memscale {

constexpr int32_t kHandOut = 64;  // storages memscale_dtr_op hands back per call

// A copy of a whole storage (every view of it keeps its geometry on the copy).
inline c10::Storage copy_storage(const c10::Storage& storage, const c10::Device& device) {
  at::Tensor src = bytes_of(storage, device);
  KernelGuard guard;
  return src.clone().storage();
}

// The op's input cells and where each sits in its arguments.
// Small vectors: most ops read and return a few tensors (no allocation then).
struct Session::Inputs {
  c10::SmallVector<CellPtr, 4> cells;
  c10::SmallVector<Slot, 4> slots;
  c10::SmallVector<int64_t, 4> ids;
  bool missing = false;
};

// The tensors of an op's results: where each sits (result, list element).
struct Session::Outputs {
  c10::SmallVector<at::Tensor, 2> tensors;
  c10::SmallVector<std::pair<int, int>, 2> places;
};

// Engine locks held until it goes out of scope.
class Session::Held {
 public:
  explicit Held(Session& s) : s_(s) {}
  ~Held() {
    for (int64_t id : ids_) s_.engine().unlock(s_.h_, id);
  }
  void lock(int64_t id) {
    if (s_.engine().lock(s_.h_, id) < 0) s_.fail("memscale_dtr_lock");
    ids_.push_back(id);
  }
  bool empty() const { return ids_.empty(); }
  void release() {
    for (int64_t id : ids_) s_.engine().unlock(s_.h_, id);
    ids_.clear();
  }

 private:
  Session& s_;
  std::vector<int64_t> ids_;
};

class Session::Level {
 public:
  Level(Session& s, c10::ArrayRef<CellPtr> cells) : s_(s) { s_.levels_.push_back(cells); }
  ~Level() { s_.levels_.pop_back(); }
  Level(const Level&) = delete;
  Level& operator=(const Level&) = delete;

 private:
  Session& s_;
};

}  // namespace memscale
