#include "wrapper.h"

#include "dispatch_key.h"
#include "session.h"

namespace memscale {

namespace {

// The last wrapper naming a cell died: its session hears of it at its next op.
void drop_wrapper(const CellPtr& cell) {
  if (cell->wrappers.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  Session* session = cell->session.load(std::memory_order_acquire);
  if (session != nullptr) session->queue_release(cell);
}

}  // namespace

DTRTensorImpl::DTRTensorImpl(CellPtr cell)
    : c10::TensorImpl(c10::DispatchKeySet(kRegionKey), cell->dtype, cell->device), cell_(std::move(cell)) {
  cell_->wrappers.fetch_add(1, std::memory_order_relaxed);
  set_sizes_and_strides(cell_->sizes, cell_->strides, cell_->offset);
  // Lazily conjugated or negated views: the wrapper carries the bit, so
  // PyTorch resolves it before an op that reads the data, as for plain tensors.
  if (cell_->conj) _set_conj(true);
  if (cell_->neg) _set_neg(true);
  set_storage_access_should_throw();
}


// The last strong reference went. (The destructor itself runs only once the
// weak references are gone too - a cell keeps one to its latest wrapper - so
// the release happens here.)
void DTRTensorImpl::release_resources() {
  if (cell_) {
    CellPtr cell = std::move(cell_);
    drop_wrapper(cell);
  }
  c10::TensorImpl::release_resources();
}

DTRTensorImpl::~DTRTensorImpl() {
  if (cell_) drop_wrapper(cell_);
}

void DTRTensorImpl::set_cell(CellPtr cell) {
  if (cell.get() == cell_.get()) return;
  cell->wrappers.fetch_add(1, std::memory_order_relaxed);
  std::swap(cell_, cell);
  if (cell) drop_wrapper(cell);
}

c10::intrusive_ptr<c10::TensorImpl> DTRTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<DTRTensorImpl>(cell_);
  copy_tensor_metadata(this, impl.get(), version_counter, allow_tensor_metadata_change);
  cell_->others.emplace_back(ImplPtr::reclaim_copy(impl.get()));
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> DTRTensorImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  return shallow_copy_and_detach(version_counter, allow_tensor_metadata_change);
}

void DTRTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  auto* other = dynamic_cast<DTRTensorImpl*>(impl.get());
  TORCH_CHECK(other != nullptr,
              "memscale.dtr: cannot set .data of a region tensor to a plain tensor inside the region "
              "(assign a region tensor, or do it outside the region)");
  copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
  set_cell(other->cell_);
}

const char* DTRTensorImpl::tensorimpl_type_name() const { return "memscale::DTRTensorImpl"; }

DTRTensorImpl* wrapper_of(const at::Tensor& t) {
  if (!t.defined() || !t.key_set().has_backend(kRegionBackend)) return nullptr;
  return dynamic_cast<DTRTensorImpl*>(t.unsafeGetTensorImpl());
}

at::Tensor make_wrapper(const CellPtr& cell) {
  at::Tensor t = at::detail::make_tensor<DTRTensorImpl>(cell);
  cell->wrapper = WeakImpl(t.getIntrusivePtr());
  return t;
}

void name_cell(DTRTensorImpl* w, const CellPtr& cell) {
  w->set_cell(cell);
  cell->wrapper = WeakImpl(ImplPtr::reclaim_copy(w));
}

}  // namespace memscale
