// The leaves of autograd graphs built outside a region entry.
//
// A backward inside an entry may run through a graph an earlier entry (or
// code outside any region) built: a GAN's generator output, made in the
// generator's phase, trained through the discriminator in the next. No op of
// the entry reads the generator's parameters, so the session never sees them
// as inputs, yet autograd accumulates their gradients - wrappers of this
// session - into their `.grad`. The session must know those leaves to hand
// their gradients back as plain tensors at its exit, as it does for the
// parameters its ops read (memscale/_region/externals.py's _note_graph).

#pragma once

#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cell.h"

namespace memscale {

// Walks the autograd graph that `t` was computed in (nothing when t has no
// grad_fn) and appends to `leaves` every leaf that requires grad and is not
// in `seen` yet. `seen` holds the nodes and leaves already walked: each node
// is visited once per entry, however many externals reach it.
void graph_leaves(const at::Tensor& t, std::unordered_set<const void*>& seen, std::vector<WeakImpl>& leaves);

}  // namespace memscale
