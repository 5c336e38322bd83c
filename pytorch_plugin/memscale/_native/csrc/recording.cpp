// Session members: what an op's run keeps for its re-runs (its arguments with
// each tensor named by its cell, the generator's state) and what it is about
// to allocate (its signature: learned sizes, else its meta kernel's).
#include "session.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string_view>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>
#include <c10/util/hash.h>

#include "dispatch_key.h"
#include "output_sizes.h"
#include "session_util.h"

namespace memscale {

namespace {

// A number per kind of argument value, for the size-prediction key.
uint64_t kind_of(const c10::IValue& v) {
  if (v.isTensor()) return 1;
  if (v.isInt()) return 2;
  if (v.isDouble()) return 3;
  if (v.isBool()) return 4;
  if (v.isIntList()) return 5;
  if (v.isNone()) return 6;
  if (v.isBoolList()) return 9;
  if (v.isDoubleList()) return 10;
  if (v.isTensorList()) return 11;
  if (v.isString()) return 12;
  if (v.isList()) return 7;
  return 8;
}

uint64_t mix(uint64_t seed, uint64_t v) { return c10::hash_combine(seed, v); }

// The number a wrapped-number tensor holds (a Python number passed where a
// tensor goes), when a re-run can make the same tensor from it: a CPU scalar
// of the dtype the number's own type gives (c10::scalar_to_tensor's).
c10::optional<c10::Scalar> wrapped_number(const c10::IValue& v) {
  if (!v.isTensor()) return c10::nullopt;
  const at::Tensor& t = v.toTensor();
  if (!t.defined() || !t.unsafeGetTensorImpl()->is_wrapped_number() || !t.device().is_cpu() || t.dim() != 0 ||
      t.requires_grad() || !t.has_storage()) {
    return c10::nullopt;
  }
  switch (t.scalar_type()) {
    case at::kDouble:
      return c10::Scalar(*t.const_data_ptr<double>());
    case at::kLong:
      return c10::Scalar(*t.const_data_ptr<int64_t>());
    case at::kBool:
      return c10::Scalar(*t.const_data_ptr<bool>());
    case at::kComplexDouble:
      return c10::Scalar(*t.const_data_ptr<c10::complex<double>>());
    default:
      return c10::nullopt;
  }
}

// What of an argument decides what an op allocates, mixed into `h`: a
// tensor's sizes, strides and dtype, a scalar's value, every element of a
// list (convolution_backward's output_mask decides which gradients it
// allocates), a string's text (padding="same"); other objects their kind only.
uint64_t mix_signature(uint64_t h, const c10::IValue& v) {
  h = mix(h, kind_of(v));
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return mix(h, 0);
    // Strides too: what an op allocates can depend on them (contiguous()
    // of a contiguous tensor is a view, of a transposed one a copy).
    for (int64_t s : t.sizes()) h = mix(h, static_cast<uint64_t>(s));
    for (int64_t s : t.strides()) h = mix(h, static_cast<uint64_t>(s) * 31 + 7);
    return mix(h, static_cast<uint64_t>(t.scalar_type()));
  }
  if (v.isInt()) return mix(h, static_cast<uint64_t>(v.toInt()));
  if (v.isDouble()) {
    double d = v.toDouble();
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof(bits));
    return mix(h, bits);
  }
  if (v.isBool()) return mix(h, v.toBool());
  if (v.isString()) return mix(h, std::hash<std::string_view>()(v.toStringView()));
  if (v.isIntList()) {
    for (int64_t x : v.toIntList()) h = mix(h, static_cast<uint64_t>(x));
    return mix(h, v.toIntList().size());
  }
  if (v.isBoolList()) {
    for (bool x : v.toBoolList()) h = mix(h, x ? 2 : 1);
    return mix(h, v.toBoolList().size());
  }
  if (v.isList() || v.isTensorList() || v.isDoubleList()) {
    size_t n = 0;
    for (const c10::IValue& x : v.toListRef()) {
      h = mix_signature(h, x);
      ++n;
    }
    return mix(h, n);
  }
  return h;
}

}  // namespace

// --------------------------------------------------------------- recording

std::unique_ptr<RecordedOp> Session::start_record(const c10::OperatorHandle& op, const OpFacts& f,
                                                  const c10::IValue* args, const Inputs& in) {
  auto rec = std::make_unique<RecordedOp>(op);
  rec->args.assign(args, args + f.n_args);
  rec->slots.assign(in.slots.begin(), in.slots.end());
  rec->inputs.assign(in.cells.begin(), in.cells.end());
  rec->shape_only = f.shape_only;
  rec->grad_mode = c10::GradMode::is_enabled();
  for (size_t i = 0; i < f.n_args && i < RecordedOp::kNumberArgs; ++i) {
    if (auto number = wrapped_number(args[i])) {
      rec->args[i] = c10::IValue(*number);
      rec->numbers |= uint32_t{1} << i;
    }
  }
  // Tensors are not kept: each slot names its cell (a list argument is copied).
  int last = -1;
  for (const Slot& s : in.slots) {
    if (s.elem >= 0 && s.arg != last) {
      own_lists(rec->args[s.arg]);
      last = s.arg;
    }
    set_tensor(rec->args[s.arg], s.elem, at::Tensor());
  }
  if (f.shape_only) {
    // The stand-in for `self` is re-made from its metadata at a re-run.
    const at::Tensor& self = args[0].toTensor();
    KernelGuard guard;
    rec->args[0] = at::empty_strided(self.sizes(), self.strides(), self.options().device(at::kMeta));
  }
  for (const CellPtr& c : in.cells) {
    if (c->pinned) c->consumed = true;
  }
  if (f.seeded) {
    c10::optional<at::Generator> gen;
    c10::optional<c10::Device> device;
    for (size_t i = 0; i < f.n_args; ++i) {
      const c10::IValue& v = args[i];
      if (v.isGenerator()) gen = v.toGenerator();
      if (!device && v.isTensor() && v.toTensor().defined()) device = v.toTensor().device();
      if (!device && v.isDevice()) device = v.toDevice();
    }
    if (!gen.has_value() || !gen->defined()) {
      c10::Device d = device.value_or(c10::Device(c10::kCPU));
      gen = d.is_cpu() ? at::detail::getDefaultCPUGenerator() : at::globalContext().defaultGenerator(d);
    }
    std::lock_guard<std::mutex> lock(gen->mutex());
    rec->rng_state = gen->get_state();
    rec->generator = gen;
  }
  return rec;
}

void Session::signature(const c10::OperatorHandle& op, const OpFacts& f, const c10::IValue* args, uint64_t* key) {
  uint64_t h = reinterpret_cast<uintptr_t>(&op.schema());
  for (size_t i = 0; i < f.n_args; ++i) h = mix_signature(h, args[i]);
  *key = h;
}

int64_t Session::predict(const c10::OperatorHandle& op, const OpFacts& f, const c10::IValue* args, uint64_t* key) {
  signature(op, f, args, key);
  last_meta_ = -1;
  int64_t known = output_sizes().learned(*key);
  if (known >= 0) return known;
  // First sight: ask the op's meta kernel what it allocates.
  KernelGuard convert;
  std::vector<c10::IValue> meta(args, args + f.n_args);
  std::vector<const c10::StorageImpl*> inputs;
  for (size_t i = 0; i < f.n_args; ++i) {
    if (static_cast<int>(i) == f.device_arg && meta[i].isDevice()) {
      meta[i] = c10::Device(at::kMeta);
      continue;
    }
    bool list = meta[i].isTensorList() || meta[i].isList();
    if (list) own_lists(meta[i]);
    std::vector<std::pair<int, at::Tensor>> converted;
    for_tensors(meta[i], [&](const at::Tensor& t, int elem) {
      if (!t.defined()) return;
      at::Tensor m = at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
      inputs.push_back(m.storage().unsafeGetStorageImpl());
      converted.emplace_back(elem, m);
    });
    for (auto& [elem, m] : converted) set_tensor(meta[i], elem, m);
  }
  int64_t bytes = -1;
  KernelGuard guard;
  try {
    torch::jit::Stack stack(meta.begin(), meta.end());
    op.callBoxed(&stack);
    bytes = 0;
    std::vector<const c10::StorageImpl*> seen;
    for (const c10::IValue& r : stack) {
      for_tensors(r, [&](const at::Tensor& t, int) {
        if (!t.defined() || t.device().type() != at::kMeta) return;
        const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
        if (std::find(inputs.begin(), inputs.end(), s) != inputs.end()) return;
        if (std::find(seen.begin(), seen.end(), s) != seen.end()) return;
        seen.push_back(s);
        bytes += static_cast<int64_t>(t.storage().nbytes());
      });
    }
  } catch (const std::exception&) {
    bytes = -1;  // no meta kernel: learned after the first run
  }
  counters_.predictions++;
  last_meta_ = bytes;
  if (bytes <= 0) return 0;
  return static_cast<int64_t>(static_cast<double>(bytes) * output_sizes().ratio(&op.schema()) + 0.5);
}

}  // namespace memscale
