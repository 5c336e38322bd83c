// The Python face of the native region (memscale._native.region_ext loads it).
//
// Python keeps what is rare: the engine's lifetime, the region's settings,
// stats, tuning and the hand-back of escaping tensors. Everything per op is
// C++ (session.h).
#include <torch/extension.h>

#include "dispatch_key.h"
#include "grad_pin.h"
#include "kernels.h"
#include "session.h"
#include "wrapper.h"

namespace py = pybind11;
using memscale::Session;

namespace {

// Enters a session on this thread: the region key in the include set, the
// session active. Returns whether the key was on before (for leave()).
bool enter(const std::shared_ptr<Session>& session) {
  memscale::refresh_kernels();
  TORCH_CHECK(memscale::active_session() == nullptr,
              "memscale.dtr: another native region is active in this process; regions do not nest");
  memscale::set_active_session(session.get());
  return memscale::set_region_included(true);
}

void leave(const std::shared_ptr<Session>& session, bool was_included) {
  memscale::set_region_included(was_included);
  if (memscale::active_session() == session.get()) memscale::set_active_session(nullptr);
}

// The sessions hand the leaves whose gradients they pin to `hooker` (a Python
// callable taking a list of tensors, which registers the gradient hook on
// each: grad_pin.h). Called from an op's thread with no session lock held.
void set_leaf_hooker(py::object hooker) {
  // Never freed: the process-wide hooker may be called until the interpreter's exit.
  auto* fn = new py::object(std::move(hooker));
  memscale::set_leaf_hooker([fn](const std::vector<at::Tensor>& leaves) {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    py::list list;
    for (const at::Tensor& leaf : leaves) list.append(py::cast(leaf));
    (*fn)(list);
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "memscale's native DTR region: the per-op path in C++";
  m.def("install", &memscale::install_kernels,
        "Register the region's kernel on every operator; '' or why the native region cannot be used");
  m.def("registered_kernels", &memscale::registered_kernels);
  m.def("unboxed_kernels", &memscale::unboxed_kernels, "How many operators reach the region through an unboxed entry.");
  m.def("set_included", &memscale::set_region_included, py::arg("on"),
        "Set the region key in this thread's include set; returns whether it was on");
  m.def("enter", &enter);
  m.def("set_leaf_hooker", &set_leaf_hooker, py::arg("hooker"),
        "Set the callable that registers the gradient hook on the leaves the sessions hand it (a list)");
  m.def("pin_gradient", &memscale::pin_accumulated, py::arg("leaf"), py::call_guard<py::gil_scoped_release>(),
        "The gradient hook's work: `leaf`'s gradient was accumulated; the open session it is a wrapper of "
        "pins it (rebuilt first if evicted)");
  m.def("leave", &leave);
  m.def("is_wrapper", [](const at::Tensor& t) { return memscale::wrapper_of(t) != nullptr; });
  m.def("unwrap", [](const at::Tensor& t) -> at::Tensor {
    memscale::DTRTensorImpl* w = memscale::wrapper_of(t);
    if (w == nullptr) return t;
    const memscale::CellPtr& cell = w->cell();
    Session* s = cell->session.load();
    if (s != nullptr) return s->read(cell);
    TORCH_CHECK(cell->tensor.defined(),
                "memscale.dtr: this tensor was evicted inside a memscale.dtr region that exited with an error; "
                "its data cannot be rebuilt");
    return cell->tensor;
  });
  py::class_<Session, std::shared_ptr<Session>>(m, "Session")
      .def(py::init([](int64_t handle, const std::string& library, bool budgeted, bool recording,
                       int64_t usage_address, bool verify, int64_t test_op_cost_ns, uint64_t test_op_cost_seed,
                       int64_t test_device_ns) {
             memscale::SessionOptions o;
             o.handle = handle;
             o.library = library;
             o.budgeted = budgeted;
             o.recording = recording;
             o.usage_address = usage_address;
             o.verify = verify;
             o.test_op_cost_ns = test_op_cost_ns;
             o.test_op_cost_seed = test_op_cost_seed;
             o.test_device_ns = test_device_ns;
             return std::make_shared<Session>(o);
           }),
           py::arg("handle"), py::arg("library"), py::arg("budgeted"), py::arg("recording"),
           py::arg("usage_address") = 0, py::arg("verify") = false, py::arg("test_op_cost_ns") = 0,
           py::arg("test_op_cost_seed") = 0, py::arg("test_device_ns") = 0)
      .def("close", &Session::close, py::arg("ok"))
      .def("set_budgeted", &Session::set_budgeted)
      .def("flush", &Session::flush)
      .def("reclaim", &Session::reclaim, py::arg("need"),
           "Evict about `need` bytes whatever the budget (the allocator's reclaim); the bytes freed, "
           "or -1 when another thread is inside the session")
      .def_property(
          "suspended", [](const Session& s) { return s.suspended.load(); },
          [](Session& s, bool on) { s.suspended.store(on); })
      .def_property_readonly("closed", &Session::closed)
      .def_property(
          "watch_backward", [](const Session& s) { return s.watch_backward.load(); },
          [](Session& s, bool on) { s.watch_backward.store(on); })
      .def("backward_failed", &Session::backward_failed,
           "Whether a watched backward pass of this entry raised (the step is over then)")
      .def("counters", [](const Session& s) {
        const auto& c = s.counters();
        py::dict d;
        d["ops"] = c.ops;
        d["reruns"] = c.reruns;
        d["predictions"] = c.predictions;
        d["copies_on_write"] = c.copies_on_write;
        d["externals"] = c.externals;
        d["nested_restarts"] = c.nested_restarts;
        d["parked"] = c.parked;
        d["exposed"] = c.exposed;
        d["device_timed"] = c.device_timed;
        d["synchronizations"] = c.synchronizations;
        d["gradients_pinned"] = c.gradients_pinned;
        return d;
      });
}
