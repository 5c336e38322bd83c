#include "errors.h"

#include <Python.h>

namespace memscale {

namespace {

// The class `name` of `module` (RuntimeError if it cannot be imported).
// Called by PyTorch's error translation with the GIL held; the caller keeps
// the result for the process (a class object lives as long as its module).
PyObject* python_class(const char* module_name, const char* name) {
  PyObject* module = PyImport_ImportModule(module_name);
  PyObject* cls = module != nullptr ? PyObject_GetAttrString(module, name) : nullptr;
  Py_XDECREF(module);
  if (cls == nullptr || !PyExceptionClass_Check(cls)) {
    PyErr_Clear();
    Py_XDECREF(cls);
    return PyExc_RuntimeError;
  }
  return cls;
}

}  // namespace

PyObject* NoRoomError::python_type() {
  static PyObject* type = python_class("memscale._native.engine", "NoRoomError");
  return type;
}

PyObject* RefusedError::python_type() {
  static PyObject* type = python_class("memscale.errors", "MemscaleError");
  return type;
}

std::string python_layout_name(c10::Layout layout) {
  switch (layout) {
    case c10::kStrided:
      return "torch.strided";
    case c10::kSparse:
      return "torch.sparse_coo";
    case c10::kSparseCsr:
      return "torch.sparse_csr";
    case c10::kSparseCsc:
      return "torch.sparse_csc";
    case c10::kSparseBsr:
      return "torch.sparse_bsr";
    case c10::kSparseBsc:
      return "torch.sparse_bsc";
    case c10::kMkldnn:
      return "torch._mkldnn";
    case c10::kJagged:
      return "torch.jagged";
    default:
      return "non-strided";
  }
}

void refuse_layout(c10::Layout layout, const std::string& what) {
  throw RefusedError("memscale.dtr: a " + python_layout_name(layout) + " tensor was passed to " + what +
                     "; only strided (dense) tensors can be used in a DTR region - convert it with .to_dense() first");
}

}  // namespace memscale
