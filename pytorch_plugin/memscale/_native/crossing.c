/*
 * crossing.c - the plugin's one call into the engine per op, without ctypes.
 *
 * A CPython extension of four functions, built from this file at first use
 * by memscale._native.crossing (cached per Python version and source) and linked
 * against nothing: the engine's memscale_dtr_op and memscale_dtr_ops are
 * reached through the function pointers the ctypes handle of libmemscale.so
 * gives (set_op, set_ops), so the extension never loads the library itself. ctypes converts each
 * argument through Python objects (about 2 us per call here); this is a
 * vectorcall function.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int64_t (*op_fn)(int64_t h, const char* name, int64_t* frame);
typedef int64_t (*ops_fn)(int64_t h, int64_t* frame);

static op_fn memscale_dtr_op;
static ops_fn memscale_dtr_ops;

/* The frame address argument; NULL with an exception set on error. */
static int64_t* frame_of(PyObject* arg) {
	int64_t* frame = (int64_t*)PyLong_AsVoidPtr(arg);
	if (frame == NULL && !PyErr_Occurred()) {
		PyErr_SetString(PyExc_ValueError, "frame must be a non-NULL address");
	}
	return frame;
}

/* A function address argument; NULL with an exception set on error. */
static void* address_of(PyObject* arg, const char* what) {
	void* p = PyLong_AsVoidPtr(arg);
	if (p == NULL && !PyErr_Occurred()) {
		PyErr_Format(PyExc_ValueError, "%s's address must not be NULL", what);
	}
	return p;
}

/* op(handle: int, name: bytes | None, frame: int) -> int: memscale_dtr_op. */
static PyObject* op(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
	(void)self;
	if (nargs != 3) {
		PyErr_SetString(PyExc_TypeError, "op(handle, name, frame) takes 3 arguments");
		return NULL;
	}
	if (memscale_dtr_op == NULL) {
		PyErr_SetString(PyExc_RuntimeError, "set_op was not called");
		return NULL;
	}
	int64_t h = PyLong_AsLongLong(args[0]);
	if (h == -1 && PyErr_Occurred()) {
		return NULL;
	}
	const char* name = NULL;
	if (args[1] != Py_None) {
		if (!PyBytes_Check(args[1])) {
			PyErr_SetString(PyExc_TypeError, "name must be bytes or None");
			return NULL;
		}
		name = PyBytes_AS_STRING(args[1]);
	}
	int64_t* frame = frame_of(args[2]);
	if (frame == NULL) {
		return NULL;
	}
	return PyLong_FromLongLong(memscale_dtr_op(h, name, frame));
}

/* ops(handle: int, frame: int) -> int: memscale_dtr_ops. */
static PyObject* ops(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
	(void)self;
	if (nargs != 2) {
		PyErr_SetString(PyExc_TypeError, "ops(handle, frame) takes 2 arguments");
		return NULL;
	}
	if (memscale_dtr_ops == NULL) {
		PyErr_SetString(PyExc_RuntimeError, "set_ops was not called");
		return NULL;
	}
	int64_t h = PyLong_AsLongLong(args[0]);
	if (h == -1 && PyErr_Occurred()) {
		return NULL;
	}
	int64_t* frame = frame_of(args[1]);
	if (frame == NULL) {
		return NULL;
	}
	return PyLong_FromLongLong(memscale_dtr_ops(h, frame));
}

/* set_op(address: int): where memscale_dtr_op is. */
static PyObject* set_op(PyObject* self, PyObject* address) {
	(void)self;
	void* p = address_of(address, "memscale_dtr_op");
	if (p == NULL) {
		return NULL;
	}
	memscale_dtr_op = (op_fn)p;
	Py_RETURN_NONE;
}

/* set_ops(address: int): where memscale_dtr_ops is. */
static PyObject* set_ops(PyObject* self, PyObject* address) {
	(void)self;
	void* p = address_of(address, "memscale_dtr_ops");
	if (p == NULL) {
		return NULL;
	}
	memscale_dtr_ops = (ops_fn)p;
	Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"op", (PyCFunction)(void (*)(void))op, METH_FASTCALL, "memscale_dtr_op(handle, name, frame)"},
    {"ops", (PyCFunction)(void (*)(void))ops, METH_FASTCALL, "memscale_dtr_ops(handle, frame)"},
    {"set_op", set_op, METH_O, "set the address of memscale_dtr_op"},
    {"set_ops", set_ops, METH_O, "set the address of memscale_dtr_ops"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_memscale_crossing", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__memscale_crossing(void) { return PyModule_Create(&module); }
