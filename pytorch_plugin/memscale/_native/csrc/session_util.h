// What several of the files defining Session's members share (internal to the
// native region, included by them only): the private nested types an op's
// path passes around (Inputs, Outputs, Held, Level) and the helpers on
// arguments' tensors and storages.
#pragma once

#include "dispatch_key.h"
#include "session.h"

namespace memscale {

constexpr int32_t kHandOut = 64;  // storages memscale_dtr_op hands back per call

// Calls `fn(tensor, elem)` for every tensor of an argument (a tensor, a list
// of tensors, a list of optional tensors); elem is -1 for a lone tensor.
template <typename Fn>
void for_tensors(const c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) {
    fn(v.toTensor(), -1);
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    for (size_t i = 0; i < list.size(); ++i) fn(list.get(i), static_cast<int>(i));
  } else if (v.isList()) {
    auto list = v.toListRef();
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].isTensor()) fn(list[i].toTensor(), static_cast<int>(i));
    }
  }
}

// Sets element `elem` (-1: the whole value) of argument `v` to `t`; lists are
// copied first, so the caller's list objects are never changed.
inline void set_tensor(c10::IValue& v, int elem, const at::Tensor& t) {
  if (elem < 0) {
    v = t;
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    list.set(elem, t);
  } else {
    auto list = v.toList();
    list.set(elem, t);
  }
}

// A copy of a list argument that can be changed without touching the original.
inline void own_lists(c10::IValue& v) {
  if (v.isTensorList()) {
    v = v.toTensorList().copy();
  } else if (v.isList()) {
    v = v.toList().copy();
  }
}

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
