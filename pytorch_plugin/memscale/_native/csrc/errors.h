// The native region's errors that Python sees as memscale's own classes.
//
// A C++ exception reaches Python through PyTorch's HANDLE_TH_ERRORS (every
// torch function and method, loss.backward() included, with autograd's
// worker threads handing theirs to the caller): c10::Error becomes a
// RuntimeError, and a torch::PyTorchError the class its python_type() names.
// So the budget loop's "nothing evictable" is raised as
// memscale._native.engine.NoRoomError on the native path too, as on the
// Python path: callers (memscale run, the largest-batch probes, a user's
// except clause) see one error whichever path ran the op.
#pragma once

#include <string>

#include <c10/core/Layout.h>
#include <torch/csrc/Exceptions.h>

namespace memscale {

// The engine found nothing (more) to evict for what was asked: every resident
// storage is pinned, locked or too small. A rebuild whose plans nested starts
// over on it (Session::rebuild).
struct NoRoomError : public torch::PyTorchError {
  explicit NoRoomError(std::string message) : torch::PyTorchError(std::move(message)) {}
  // memscale._native.engine.NoRoomError (RuntimeError if it cannot be imported).
  PyObject* python_type() override;
};

// What the region refuses on purpose (a tensor layout it cannot hold):
// memscale.errors.MemscaleError, as the Python region raises it.
struct RefusedError : public torch::PyTorchError {
  explicit RefusedError(std::string message) : torch::PyTorchError(std::move(message)) {}
  PyObject* python_type() override;
};

// A layout as Python names it (torch.sparse_coo), for messages.
std::string python_layout_name(c10::Layout layout);

// Refuses a `layout` tensor passed to `what` (an operator's name, or "an op").
[[noreturn]] void refuse_layout(c10::Layout layout, const std::string& what);

}  // namespace memscale
