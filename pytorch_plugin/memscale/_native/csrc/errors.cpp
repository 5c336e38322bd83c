#include "errors.h"

#include <Python.h>

namespace memscale {

PyObject* NoRoomError::python_type() {
  // Called by PyTorch's error translation with the GIL held. Looked up once
  // and kept (a class object lives as long as its module).
  static PyObject* type = [] {
    PyObject* module = PyImport_ImportModule("memscale._native.engine");
    PyObject* cls = module != nullptr ? PyObject_GetAttrString(module, "NoRoomError") : nullptr;
    Py_XDECREF(module);
    if (cls == nullptr || !PyExceptionClass_Check(cls)) {
      PyErr_Clear();
      Py_XDECREF(cls);
      return PyExc_RuntimeError;
    }
    return cls;  // the reference is kept for the process
  }();
  return type;
}

}  // namespace memscale
