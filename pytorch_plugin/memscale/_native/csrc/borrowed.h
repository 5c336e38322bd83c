// Stack slots holding tensors the stack does not own: an unboxed entry's
// arguments (unboxed.h), boxed without taking a reference.
//
// Why: in torch 2.11 and 2.15 (the GPU machine's and the tests') a TensorImpl
// that has a Python object references that object while C++ holds a second
// reference to the tensor (c10/util/intrusive_ptr.h: a count going from 1 to
// 2 calls incref_pyobject, back to 1 decref_pyobject), and both take the GIL,
// which the Python bindings released around the op. Boxing a program's
// tensor (a copy into the stack) and dropping it again cost two GIL round
// trips per tensor argument. A borrowed slot is a tensor at +0
// (c10::MaybeOwnedTraits<at::Tensor>::createBorrow): reading it is free; it
// must leave the stack through take() (dropped without a decrement) or own()
// (made an ordinary reference) - never destroyed or overwritten in place.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/util/MaybeOwned.h>

namespace memscale {

class BorrowedArgs {
 public:
  // At most this many slots are borrowed (later tensors are pushed owned).
  static constexpr size_t kMost = 16;

  explicit BorrowedArgs(torch::jit::Stack& stack) : stack_(stack) {}
  // Slots still borrowed leave the stack without a decrement (an exception
  // on the way: the caller's references are untouched).
  ~BorrowedArgs() { take_all(); }
  BorrowedArgs(const BorrowedArgs&) = delete;
  BorrowedArgs& operator=(const BorrowedArgs&) = delete;

  // Pushes t: borrowed when defined and a slot is left, else owned.
  void push(const at::Tensor& t) {
    const size_t pos = stack_.size();
    if (!t.defined() || pos >= kMost) {
      stack_.emplace_back(t);
      return;
    }
    stack_.emplace_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(t));
    impls_[pos] = t.unsafeGetTensorImpl();
    mask_ |= uint32_t{1} << pos;
  }

  bool any() const { return mask_ != 0; }

  // Slot pos (of the stack) stops being borrowed, its value None; nothing
  // if it is not borrowed.
  void take(size_t pos) {
    if (pos >= kMost || !(mask_ & (uint32_t{1} << pos))) return;
    mask_ &= ~(uint32_t{1} << pos);
    if (!lent_at(pos)) return;  // not where it was put: left alone (a leak, never a wrong count)
    at::Tensor t = std::move(stack_[pos]).toTensor();
    c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(t);
    stack_[pos] = c10::IValue();
  }

  // Every slot still borrowed becomes an ordinary reference to its tensor.
  void own() {
    for (size_t pos = 0; mask_ != 0 && pos < kMost; ++pos) {
      if (!(mask_ & (uint32_t{1} << pos))) continue;
      if (!lent_at(pos)) {
        mask_ &= ~(uint32_t{1} << pos);
        continue;
      }
      at::Tensor owned = stack_[pos].toTensor();  // +1: the caller's reference stays
      take(pos);
      stack_[pos] = std::move(owned);
    }
  }

 private:
  // Whether slot pos still holds the tensor lent there.
  bool lent_at(size_t pos) const {
    return pos < stack_.size() && stack_[pos].isTensor() && stack_[pos].unsafeToTensorImpl() == impls_[pos];
  }

  void take_all() {
    for (size_t pos = 0; mask_ != 0 && pos < kMost; ++pos) take(pos);
  }

  torch::jit::Stack& stack_;
  uint32_t mask_ = 0;
  std::array<const c10::TensorImpl*, kMost> impls_{};
};

}  // namespace memscale
