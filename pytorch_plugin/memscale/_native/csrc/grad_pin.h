// Gradients pinned once accumulated (memscale/_region/externals.py's
// _pin_gradient on the Python region).
//
// A parameter's .grad outlives the step and the optimizer reads it: evicting
// it would mean re-running the backward pass that produced it. So, as soon as
// autograd accumulates a gradient that is a wrapper of an open session, that
// session makes it resident (rebuilt first if it was evicted) and pins it in
// the engine, once per cell (Session::pin_gradient).
//
// What tells the session is a Python post-accumulate-grad hook on the leaf.
// PyTorch keeps one post-accumulate-grad slot per tensor, which Python's
// register_post_accumulate_grad_hook fills with its own dispatcher of every
// hook registered from Python: a C++ hook there would replace the program's
// hooks or be replaced by them. So the hook is registered through that Python
// API, beside the program's, once per leaf for the process's life: the leaves
// a session notes (the externals its ops read, the leaves of graphs built
// outside it: graph_leaves.h) that no earlier session handed over are handed
// to the hooker Python set (memscale/_region/native.py) at the end of the op
// that found them, with the session's lock released - never per op, and not
// again once hooked. The hook calls pin_accumulated(leaf), which does nothing
// for a plain gradient or a closed session's wrapper. Post-accumulate hooks
// run on the autograd thread right after the accumulation, before any later
// backward op could evict the gradient.
#pragma once

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace memscale {

// Registers the gradient hook on each of the leaves (Python: the GIL taken
// inside). Set once by the extension's module; none set, no leaf is hooked.
using LeafHooker = std::function<void(const std::vector<at::Tensor>& leaves)>;
void set_leaf_hooker(LeafHooker hooker);

// Whether `leaf` has not been handed to the hooker yet (false without a hooker).
bool needs_hook(const at::Tensor& leaf);

// Hands the leaves not hooked yet to the hooker and remembers them (weakly:
// process-wide, whatever session found them). Call with no session lock held.
void hook_leaves(std::vector<at::Tensor> leaves);

// The hook's work: `leaf`'s gradient was just accumulated; the open session
// it is a wrapper of pins it (nothing for a plain gradient or a closed one).
void pin_accumulated(const at::Tensor& leaf);

}  // namespace memscale
