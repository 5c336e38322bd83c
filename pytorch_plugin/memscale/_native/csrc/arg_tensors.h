// The tensors of an operator's arguments on a boxed stack: a lone tensor, a
// list of tensors, a list of optional tensors - read, replaced, or the lists
// copied so the caller's list objects are never changed.
#pragma once

#include <ATen/core/ivalue.h>

namespace memscale {

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

}  // namespace memscale
