// Package evict is memscale's Dynamic Tensor Rematerialization policy: the
// candidate set, the eviction heuristics (h_DTR e*, h_DTR^eq, h_DTR^local,
// h_MSPS, LRU, size, and memscale's default), the candidate index, the budget
// loop with its swap-or-recompute decision, eager eviction and banishing of
// released tensors, and the Engine facade that both the C ABI
// (memscale_dtr_*) and the trace replay runtime drive.
//
// An Engine is not safe for concurrent use; the C ABI serializes calls per
// handle.
package evict
