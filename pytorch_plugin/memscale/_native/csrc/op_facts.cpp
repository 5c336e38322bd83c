#include "op_facts.h"

#include <algorithm>
#include <unordered_set>

#include <ATen/core/enum_tag.h>

#include "engine_abi.h"

namespace memscale {

namespace {

// Ops that write running statistics their schema does not mark (a!):
// positions written, and the position of the `training` flag that decides it
// (the list of memscale/_region/schema.py's UNDECLARED_STATE_WRITES).
struct UndeclaredWrites {
  const char* base;
  std::vector<int> positions;
  int flag;
};
const std::vector<UndeclaredWrites>& undeclared_writes() {
  static const std::vector<UndeclaredWrites> table = {
      {"native_batch_norm", {3, 4}, 5},
      {"cudnn_batch_norm", {3, 4}, 5},
      {"miopen_batch_norm", {3, 4}, 5},
      {"_batch_norm_impl_index", {3, 4}, 5},
  };
  return table;
}

// The *_like factories and new_* methods: `self` gives metadata only.
bool is_shape_only(const std::string& base) {
  static const std::unordered_set<std::string> names = {
      "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like",
      "new_empty",  "new_empty_strided", "new_zeros", "new_ones", "new_full"};
  return names.count(base) > 0;
}


std::unique_ptr<OpFacts> compute(const c10::OperatorHandle& op) {
  auto f = std::make_unique<OpFacts>();
  const c10::FunctionSchema& schema = op.schema();
  const auto& name = schema.operator_name();
  std::string base = name.name;
  auto colons = base.find("::");
  std::string ns = colons == std::string::npos ? "" : base.substr(0, colons);
  if (colons != std::string::npos) base = base.substr(colons + 2);
  f->name = name.overload_name.empty() ? base : base + "." + name.overload_name;
  f->n_args = schema.arguments().size();
  f->n_returns = schema.returns().size();

  std::unordered_map<c10::Symbol, int> set_owner;  // alias set -> first argument in it
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto& arg = schema.arguments()[i];
    if (arg.name() == "device") f->device_arg = static_cast<int>(i);
    const c10::AliasInfo* alias = arg.alias_info();
    if (alias == nullptr || !is_tensor_type(arg.type())) continue;
    if (alias->isWrite()) f->mutated.push_back(static_cast<int>(i));
    for (const auto& s : alias->beforeSets()) set_owner.emplace(s, static_cast<int>(i));
  }
  bool declared = !f->mutated.empty();
  for (const auto& w : undeclared_writes()) {
    if (base != w.base) continue;
    for (int i : w.positions) {
      if (i < static_cast<int>(f->n_args) && is_tensor_type(schema.arguments()[i].type()) &&
          std::find(f->mutated.begin(), f->mutated.end(), i) == f->mutated.end()) {
        f->mutated.push_back(i);
      }
    }
    f->writes_if = w.flag;
    f->undeclared_only = !declared;
  }

  bool all_views = !schema.returns().empty();
  bool views_first = all_views;
  const c10::AliasInfo* first = schema.arguments().empty() ? nullptr : schema.arguments()[0].alias_info();
  for (const auto& ret : schema.returns()) {
    const c10::AliasInfo* alias = ret.alias_info();
    int source = -1;
    if (alias != nullptr && alias->isWrite()) {
      for (const auto& s : alias->beforeSets()) {
        auto it = set_owner.find(s);
        if (it != set_owner.end()) {
          source = it->second;
          break;
        }
      }
    }
    f->returns_arg.push_back(source);
    if (alias == nullptr) {
      all_views = false;
      views_first = false;
    } else if (alias->isWrite() || first == nullptr || first->isWrite()) {
      views_first = false;
    } else {
      for (const auto& s : alias->beforeSets()) {
        if (first->beforeSets().count(s) == 0) views_first = false;
      }
    }
  }
  f->all_views = all_views;
  f->views_first = views_first && !first->beforeSets().empty();
  f->seeded = op.hasTag(at::Tag::nondeterministic_seeded);
  f->inplace_view = op.hasTag(at::Tag::inplace_view);
  f->shape_only = is_shape_only(base) && f->mutated.empty() && f->device_arg >= 0 && f->n_args > 0 &&
                  schema.arguments()[0].name() == "self" &&
                  schema.arguments()[0].type()->kind() == c10::TypeKind::TensorType;
  std::string stripped = base.substr(base.find_first_not_of('_') == std::string::npos ? 0 : base.find_first_not_of('_'));
  f->reproducible = !op.hasTag(at::Tag::nondeterministic_bitwise) && stripped.rfind("empty", 0) != 0 &&
                    stripped.rfind("new_empty", 0) != 0;
  if (ns == "c10d" || ns == "_c10d_functional" || ns == "c10d_functional") f->flags |= kNoRecompute;
  return f;
}

}  // namespace

bool is_tensor_type(const c10::TypePtr& type) {
  auto t = type;
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  if (t->kind() == c10::TypeKind::TensorType) return true;
  if (auto list = t->cast<c10::ListType>()) {
    auto e = list->getElementType();
    if (auto opt = e->cast<c10::OptionalType>()) e = opt->getElementType();
    return e->kind() == c10::TypeKind::TensorType;
  }
  return false;
}

bool OpFacts::writes(const c10::IValue* args) const {
  if (mutated.empty()) return false;
  if (undeclared_only && writes_if >= 0) {
    const c10::IValue& flag = args[writes_if];
    return flag.isBool() && flag.toBool();
  }
  return true;
}

OpFactsTable& facts_table() {
  static OpFactsTable* table = new OpFactsTable();
  return *table;
}

const OpFacts& OpFactsTable::of(const c10::OperatorHandle& op) {
  // Facts are never removed, so a pointer once found stays valid.
  thread_local std::unordered_map<const void*, const OpFacts*> seen;
  const void* key = &op.schema();
  auto it = seen.find(key);
  if (it != seen.end()) return *it->second;
  const OpFacts& f = shared(op);
  seen.emplace(key, &f);
  return f;
}

const OpFacts& OpFactsTable::shared(const c10::OperatorHandle& op) {
  const void* key = &op.schema();
  std::lock_guard<std::mutex> guard(mu_);
  auto it = facts_.find(key);
  if (it != facts_.end()) return *it->second;
  auto& slot = facts_[key];
  slot = compute(op);
  slot->index = facts_.size() - 1;
  return *slot;
}

}  // namespace memscale
