#include "wrapper.h"

#include <algorithm>
#include <string>
#include <typeinfo>

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

// What data_ptr, const_data_ptr and untyped_storage say on a wrapper whose
// storage the engine evicted.
constexpr const char* kEvicted =
    "memscale.dtr: this region tensor has no data: the engine evicted its storage (dropped or swapped out) and no "
    "open region entry can rebuild it - it was evicted inside a memscale.dtr region that exited with an error, so "
    "its data cannot be rebuilt (inside an open entry a data pointer access rebuilds it)";

}  // namespace

DTRTensorImpl::DTRTensorImpl(CellPtr cell, const c10::Storage& storage)
    : c10::TensorImpl(c10::DispatchKeySet(kRegionKey), cell->dtype, cell->device), cell_(std::move(cell)) {
  cell_->wrappers.fetch_add(1, std::memory_order_relaxed);
  set_sizes_and_strides(cell_->sizes, cell_->strides, cell_->offset);
  // Lazily conjugated or negated views: the wrapper carries the bit, so
  // PyTorch resolves it before an op that reads the data, as for plain tensors.
  if (cell_->conj) _set_conj(true);
  if (cell_->neg) _set_neg(true);
  hold(storage);
}

void DTRTensorImpl::hold(const c10::Storage& storage) {
  if (storage) {
    // The cell's offset and strides are into this storage (a view's into its base's).
    storage_ = storage;
    storage_access_should_throw_ = false;
  } else if (storage_ || !storage_access_should_throw_) {
    // Drops the reference (the engine frees the storage once the group and
    // the cells let go of it too) and makes data and storage access throw.
    release_storage_and_set_meta_custom_data_ptr_error_msg_(std::string(kEvicted));
  }
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

void DTRTensorImpl::expose() const {
  // Once exposed a cell stays resident: nothing to do on later accesses.
  if (!cell_ || cell_->exposed) return;
  Session* session = cell_->session.load(std::memory_order_acquire);
  if (session != nullptr) session->expose(cell_);
}

bool DTRTensorImpl::has_storage() const {
  expose();
  return static_cast<bool>(storage_);
}

const c10::Storage& DTRTensorImpl::storage() const {
  expose();
  return c10::TensorImpl::storage();  // throws, naming the eviction, when evicted
}

c10::intrusive_ptr<c10::TensorImpl> DTRTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<DTRTensorImpl>(cell_, storage_);
  // Copies the storage (or its absence, and the error saying why) too.
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
  // It holds the other's storage now: the session must find it to take that
  // storage at an eviction, as it finds the shallow copies.
  cell_->others.emplace_back(ImplPtr::reclaim_copy(this));
}

const char* DTRTensorImpl::tensorimpl_type_name() const { return "memscale::DTRTensorImpl"; }

DTRTensorImpl* wrapper_of(const at::Tensor& t) {
  if (!t.defined() || !t.key_set().has_backend(kRegionBackend)) return nullptr;
  // DTRTensorImpl is final: a type check, not a walk of the class hierarchy.
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return typeid(*impl) == typeid(DTRTensorImpl) ? static_cast<DTRTensorImpl*>(impl) : nullptr;
}

at::Tensor make_wrapper(const CellPtr& cell, const c10::Storage& storage) {
  at::Tensor t = at::detail::make_tensor<DTRTensorImpl>(cell, storage);
  if (cell->wrapper.has_value() && !cell->wrapper->expired()) cell->others.push_back(*cell->wrapper);
  cell->wrapper = WeakImpl(t.getIntrusivePtr());
  return t;
}

void name_cell(DTRTensorImpl* w, const CellPtr& cell, const c10::Storage& storage) {
  w->set_cell(cell);
  w->hold(storage);
  // The cell's latest wrapper so far stays known (an eviction must reach it).
  if (cell->wrapper.has_value() && !cell->wrapper->expired()) {
    ImplPtr latest = cell->wrapper->lock();
    if (latest && latest.get() != w) cell->others.push_back(*cell->wrapper);
  }
  cell->wrapper = WeakImpl(ImplPtr::reclaim_copy(w));
}

void share_storage(Cell& cell, const c10::Storage& storage) {
  // Only wrappers are recorded in a cell; one that names another cell by now
  // (moved to a new version) is left alone.
  auto give = [&](const WeakImpl& weak) {
    ImplPtr impl = weak.lock();
    if (!impl) return false;
    auto* w = static_cast<DTRTensorImpl*>(impl.get());
    if (w->cell().get() == &cell) w->hold(storage);
    return true;
  };
  if (cell.wrapper.has_value() && !give(*cell.wrapper)) cell.wrapper.reset();
  cell.others.erase(std::remove_if(cell.others.begin(), cell.others.end(),
                                   [&](const WeakImpl& weak) { return !give(weak); }),
                    cell.others.end());
}

}  // namespace memscale
