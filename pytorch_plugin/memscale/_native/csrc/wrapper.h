// The native region's wrapper tensor: metadata, and its cell's storage while resident.
//
// A DTRTensorImpl has sizes, strides, dtype and device; its data is the
// cell's real tensor, present only while the engine keeps that storage
// resident. While it is, the wrapper holds that storage too (as ATen's
// FunctionalTensorWrapper holds its own), with the cell's offset, so what
// reads a data pointer directly works on it: CompositeImplicitAutograd ops
// take fast paths that do for tensors that are not "subclass-like"
// (max_pool1d without grad on the CPU, ctc_loss with tensor lengths). The
// session takes the storage from every wrapper of a group when the engine
// evicts it (a wrapper must never keep an evicted storage alive: the budget
// would break silently) and gives it back at the rebuild. A data pointer or
// storage taken from a wrapper inside an open entry first rebuilds its cell
// if evicted and keeps it resident until released (Session::expose: the raw
// pointer may be read after later ops); once nothing can rebuild it (its
// entry exited with an error) they fail, saying why. Its dispatch key is the PrivateUse2 backend (see
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
  // `storage`: its cell's group's storage, or none while that is evicted.
  DTRTensorImpl(CellPtr cell, const c10::Storage& storage);
  ~DTRTensorImpl() override;
  void release_resources() override;

  // The cell it names (changes when an in-place op makes a new version).
  const CellPtr& cell() const { return cell_; }
  void set_cell(CellPtr cell);
  // Holds `storage` (its group's, resident), or none (evicted): data_ptr and
  // storage access fail then, naming the eviction.
  void hold(const c10::Storage& storage);

  // Every data pointer access (data_ptr, const_data_ptr, mutable_data_ptr)
  // asks has_storage() first, untyped_storage() asks storage(): the cell is
  // exposed first (rebuilt if evicted, then kept resident - Session::expose).
  bool has_storage() const override;
  const c10::Storage& storage() const override;

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  const char* tensorimpl_type_name() const override;
  void expose() const;
  CellPtr cell_;
};

// The wrapper of `t`, or null when `t` is no wrapper.
DTRTensorImpl* wrapper_of(const at::Tensor& t);

// A new wrapper tensor for `cell` (its geometry is the cell's), holding
// `storage` (the cell's group's; none while evicted).
at::Tensor make_wrapper(const CellPtr& cell, const c10::Storage& storage);

// Makes wrapper `w` name `cell` (after an in-place op made a new version),
// holding `storage` (the new cell's group's).
void name_cell(DTRTensorImpl* w, const CellPtr& cell, const c10::Storage& storage);

// Makes every live wrapper naming `cell` (its latest and the others) hold
// `storage` - the group's after a rebuild, none after an eviction - and
// forgets the wrappers that died.
void share_storage(Cell& cell, const c10::Storage& storage);

}  // namespace memscale
