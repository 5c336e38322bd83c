// The native region's wrapper tensor: metadata only, data held by its cell.
//
// A DTRTensorImpl has sizes, strides, dtype and device, and no storage: its
// data is the cell's real tensor, present only while the engine keeps that
// storage resident. Its dispatch key is the PrivateUse2 backend (see
// dispatch_key.h), so every op on it reaches the region's kernel, which
// unwraps, rebuilds what was evicted, runs the op and wraps the results. The
// pattern is ATen's FunctionalTensorWrapper and functorch's BatchedTensorImpl:
// autograd sees the wrapper (its own version counter and autograd meta),
// the kernels see the real tensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include "cell.h"

namespace memscale {

class DTRTensorImpl final : public c10::TensorImpl {
 public:
  explicit DTRTensorImpl(CellPtr cell);
  ~DTRTensorImpl() override;
  void release_resources() override;

  // The cell it names (changes when an in-place op makes a new version).
  const CellPtr& cell() const { return cell_; }
  void set_cell(CellPtr cell);

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  const char* tensorimpl_type_name() const override;
  CellPtr cell_;
};

// The wrapper of `t`, or null when `t` is no wrapper.
DTRTensorImpl* wrapper_of(const at::Tensor& t);

// A new wrapper tensor for `cell` (its geometry is the cell's).
at::Tensor make_wrapper(const CellPtr& cell);

// Makes wrapper `w` name `cell` (after an in-place op made a new version).
void name_cell(DTRTensorImpl* w, const CellPtr& cell);

}  // namespace memscale
