#include "engine_abi.h"

#include <dlfcn.h>

#include <mutex>

#include <c10/util/Exception.h>

namespace memscale {

namespace {

template <typename F>
void bind(void* handle, const char* name, F& slot, const std::string& path) {
  void* symbol = dlsym(handle, name);
  TORCH_CHECK(symbol != nullptr, "memscale native region: ", path, " lacks ", name,
              "; it is older than this package: rebuild it (make lib)");
  slot = reinterpret_cast<F>(symbol);
}

}  // namespace

const EngineAbi& EngineAbi::load(const std::string& path) {
  static EngineAbi abi;
  static std::string loaded;
  static std::mutex mu;
  std::lock_guard<std::mutex> guard(mu);
  if (!loaded.empty()) {
    TORCH_CHECK(loaded == path, "memscale native region: bound to ", loaded, " already, asked for ", path);
    return abi;
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  TORCH_CHECK(handle != nullptr, "memscale native region: ", path,
              " is not loaded in this process (load the memscale library first): ", dlerror());
  bind(handle, "memscale_dtr_tensor", abi.tensor, path);
  bind(handle, "memscale_dtr_call", abi.call, path);
  bind(handle, "memscale_dtr_op", abi.op, path);
  bind(handle, "memscale_dtr_ops", abi.ops, path);
  bind(handle, "memscale_dtr_name", abi.name, path);
  bind(handle, "memscale_dtr_mutate", abi.mutate, path);
  bind(handle, "memscale_dtr_lock", abi.lock, path);
  bind(handle, "memscale_dtr_unlock", abi.unlock, path);
  bind(handle, "memscale_dtr_pin", abi.pin, path);
  bind(handle, "memscale_dtr_evict", abi.evict, path);
  bind(handle, "memscale_dtr_reclaim", abi.reclaim, path);
  bind(handle, "memscale_dtr_plan", abi.plan, path);
  bind(handle, "memscale_dtr_abandon_plans", abi.abandon_plans, path);
  bind(handle, "memscale_dtr_rematerialized", abi.rematerialized, path);
  bind(handle, "memscale_dtr_swapped_in", abi.swapped_in, path);
  bind(handle, "memscale_dtr_park", abi.park, path);
  bind(handle, "memscale_dtr_finish", abi.finish, path);
  bind(handle, "memscale_dtr_status_of", abi.status_of, path);
  bind(handle, "memscale_last_error", abi.last_error, path);
  loaded = path;
  return abi;
}

}  // namespace memscale
