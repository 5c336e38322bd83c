// A table keyed by the engine's ids, which count up from where a session's
// first one starts: a deque of slots indexed by id - base.
//
// Replaces std::unordered_map for a session's groups (keyed by root tensor
// id) and recorded ops (keyed by op id): no hashing and no node allocation
// per op on the hot path, and, as with the map, a reference to an element
// stays valid while others are added (std::deque keeps references on
// push_back and push_front). Ids below the first one are added at the front.
// Iteration is in id order.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>

#include <c10/util/Exception.h>

namespace memscale {

template <typename T>
class IdTable {
 public:
  // The element for id, made (default-constructed) if absent.
  T& operator[](int64_t id) {
    Slot& s = slot(id);
    s.present = true;
    return s.value;
  }

  // The element for id, or null.
  T* find(int64_t id) {
    if (id < base_ || id - base_ >= static_cast<int64_t>(slots_.size())) return nullptr;
    Slot& s = slots_[static_cast<size_t>(id - base_)];
    return s.present ? &s.value : nullptr;
  }

  const T* find(int64_t id) const { return const_cast<IdTable*>(this)->find(id); }

  // The element for id, which must be present.
  T& at(int64_t id) {
    T* v = find(id);
    TORCH_CHECK(v != nullptr, "memscale.dtr: internal error: no entry for id ", id,
                " in the native region's tables (please report this with the model that raised it)");
    return *v;
  }

  // Calls fn(id, element) for every element, in id order.
  template <typename Fn>
  void for_each(Fn&& fn) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].present) fn(base_ + static_cast<int64_t>(i), slots_[i].value);
    }
  }

  void clear() {
    slots_.clear();
    base_ = 0;
  }

 private:
  struct Slot {
    T value{};
    bool present = false;
  };

  Slot& slot(int64_t id) {
    if (slots_.empty()) base_ = id;
    while (id < base_) {
      slots_.emplace_front();
      --base_;
    }
    while (id - base_ >= static_cast<int64_t>(slots_.size())) slots_.emplace_back();
    return slots_[static_cast<size_t>(id - base_)];
  }

  std::deque<Slot> slots_;
  int64_t base_ = 0;
};

}  // namespace memscale
