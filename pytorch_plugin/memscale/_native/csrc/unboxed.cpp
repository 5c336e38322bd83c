#include "unboxed.h"

#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <ATen/ops/_fused_rms_norm_ops.h>
#include <ATen/ops/_fused_rms_norm_backward_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/_native_batch_norm_legit_no_training_ops.h>
#include <ATen/ops/_reshape_alias_ops.h>
#include <ATen/ops/_safe_softmax_ops.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_to_copy_ops.h>
#include <ATen/ops/_unsafe_view_ops.h>
#include <ATen/ops/abs_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/alias_ops.h>
#include <ATen/ops/amax_ops.h>
#include <ATen/ops/avg_pool2d_ops.h>
#include <ATen/ops/avg_pool2d_backward_ops.h>
#include <ATen/ops/baddbmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/clamp_ops.h>
#include <ATen/ops/clone_ops.h>
#include <ATen/ops/constant_pad_nd_ops.h>
#include <ATen/ops/convolution_ops.h>
#include <ATen/ops/convolution_backward_ops.h>
#include <ATen/ops/cos_ops.h>
#include <ATen/ops/cudnn_batch_norm_backward_ops.h>
#include <ATen/ops/cudnn_convolution_ops.h>
#include <ATen/ops/cumsum_ops.h>
#include <ATen/ops/detach_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/elu_ops.h>
#include <ATen/ops/elu_backward_ops.h>
#include <ATen/ops/embedding_ops.h>
#include <ATen/ops/embedding_dense_backward_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/expand_ops.h>
#include <ATen/ops/gather_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/hardswish_ops.h>
#include <ATen/ops/hardswish_backward_ops.h>
#include <ATen/ops/hardtanh_ops.h>
#include <ATen/ops/hardtanh_backward_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/leaky_relu_ops.h>
#include <ATen/ops/leaky_relu_backward_ops.h>
#include <ATen/ops/lift_fresh_ops.h>
#include <ATen/ops/log_ops.h>
#include <ATen/ops/log_sigmoid_backward_ops.h>
#include <ATen/ops/log_sigmoid_forward_ops.h>
#include <ATen/ops/masked_fill_ops.h>
#include <ATen/ops/max_pool2d_with_indices_ops.h>
#include <ATen/ops/max_pool2d_with_indices_backward_ops.h>
#include <ATen/ops/maximum_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/minimum_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mse_loss_ops.h>
#include <ATen/ops/mse_loss_backward_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_batch_norm_backward_ops.h>
#include <ATen/ops/native_dropout_ops.h>
#include <ATen/ops/native_dropout_backward_ops.h>
#include <ATen/ops/native_group_norm_ops.h>
#include <ATen/ops/native_group_norm_backward_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/nll_loss_backward_ops.h>
#include <ATen/ops/nll_loss_forward_ops.h>
#include <ATen/ops/permute_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/rsub_ops.h>
#include <ATen/ops/select_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/sigmoid_backward_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/silu_backward_ops.h>
#include <ATen/ops/sin_ops.h>
#include <ATen/ops/slice_ops.h>
#include <ATen/ops/softplus_ops.h>
#include <ATen/ops/softplus_backward_ops.h>
#include <ATen/ops/split_ops.h>
#include <ATen/ops/split_with_sizes_ops.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/squeeze_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/t_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/tanh_backward_ops.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/transpose_ops.h>
#include <ATen/ops/tril_ops.h>
#include <ATen/ops/unbind_ops.h>
#include <ATen/ops/unsqueeze_ops.h>
#include <ATen/ops/upsample_nearest2d_ops.h>
#include <ATen/ops/upsample_nearest2d_backward_ops.h>
#include <ATen/ops/view_ops.h>
#include <ATen/ops/where_ops.h>

#include "borrowed.h"
#include "kernels.h"

namespace memscale {

namespace {

// One argument onto the stack: a tensor borrowed, anything else as
// PyTorch's own boxing pushes it.
inline void push_arg(torch::jit::Stack& stack, BorrowedArgs& borrowed, const at::Tensor& t) { borrowed.push(t); }

inline void push_arg(torch::jit::Stack& stack, BorrowedArgs& borrowed, const c10::optional<at::Tensor>& t) {
  if (t.has_value() && t->defined()) {
    borrowed.push(*t);
  } else {
    stack.emplace_back();
  }
}

template <class T>
inline void push_arg(torch::jit::Stack& stack, BorrowedArgs&, const T& arg) {
  torch::jit::push(stack, arg);
}

// The entry of operator Op (an at::_ops struct): its C++ signature is the
// schema's, with the dispatch key set first.
template <class Op, class Schema = typename Op::schema>
struct Entry;

template <class Op, class Ret, class... Args>
struct Entry<Op, Ret(Args...)> {
  static Ret call(c10::DispatchKeySet, Args... args) {
    static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    torch::jit::Stack stack;
    stack.reserve(sizeof...(Args));
    {
      BorrowedArgs borrowed(stack);
      (push_arg(stack, borrowed, args), ...);
      region_call(op, &stack, &borrowed);
    }
    return c10::impl::PopResult<Ret>::call(stack);
  }
};

template <class Op>
UnboxedKernel make_entry() {
  using Fn = decltype(Entry<Op>::call);
  return UnboxedKernel{c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(Entry<Op>::call)),
                       c10::impl::CppSignature::make<Fn>()};
}

struct Listed {
  const char* name;      // without the "aten::" namespace
  const char* overload;  // "" for the default overload
  UnboxedKernel (*make)();
};

// The operators of a transformer's or a convolutional network's step that
// take tensors the program holds: arithmetic, matrix products, activations
// and their backward kernels, normalization, dropout, views; losses,
// convolutions, pooling and attention. A new operator is one line here (and
// its header): the template takes its signature from its at::_ops struct,
// which must exist in every torch the extension builds against (2.11 on the
// GPU machine: docs/testing.md's syntax check). In-place and
// out= overloads are not listed: they write their arguments and take the
// boxed path's mutation handling anyway.
#define MEMSCALE_ENTRY(op) {#op, "", &make_entry<at::_ops::op>}
#define MEMSCALE_ENTRY_OVERLOAD(op, overload) {#op, #overload, &make_entry<at::_ops::op##_##overload>}

const Listed kListed[] = {
    MEMSCALE_ENTRY_OVERLOAD(add, Tensor),
    MEMSCALE_ENTRY_OVERLOAD(add, Scalar),
    MEMSCALE_ENTRY_OVERLOAD(sub, Tensor),
    MEMSCALE_ENTRY_OVERLOAD(mul, Tensor),
    MEMSCALE_ENTRY_OVERLOAD(mul, Scalar),
    MEMSCALE_ENTRY_OVERLOAD(div, Tensor),
    MEMSCALE_ENTRY_OVERLOAD(div, Scalar),
    MEMSCALE_ENTRY_OVERLOAD(pow, Tensor_Scalar),
    MEMSCALE_ENTRY(neg),
    MEMSCALE_ENTRY(exp),
    MEMSCALE_ENTRY(rsqrt),
    MEMSCALE_ENTRY(mm),
    MEMSCALE_ENTRY(addmm),
    MEMSCALE_ENTRY(bmm),
    MEMSCALE_ENTRY(relu),
    MEMSCALE_ENTRY(threshold_backward),
    MEMSCALE_ENTRY(gelu),
    MEMSCALE_ENTRY(gelu_backward),
    MEMSCALE_ENTRY(silu),
    MEMSCALE_ENTRY(silu_backward),
    MEMSCALE_ENTRY(sigmoid),
    MEMSCALE_ENTRY(tanh),
    MEMSCALE_ENTRY(tanh_backward),
    MEMSCALE_ENTRY(_softmax),
    MEMSCALE_ENTRY(_safe_softmax),
    MEMSCALE_ENTRY(_softmax_backward_data),
    MEMSCALE_ENTRY(tril),
    MEMSCALE_ENTRY(constant_pad_nd),
    MEMSCALE_ENTRY(native_layer_norm),
    MEMSCALE_ENTRY(native_layer_norm_backward),
    MEMSCALE_ENTRY(native_dropout),
    MEMSCALE_ENTRY(native_dropout_backward),
    MEMSCALE_ENTRY(embedding),
    MEMSCALE_ENTRY(embedding_dense_backward),
    MEMSCALE_ENTRY_OVERLOAD(sum, dim_IntList),
    MEMSCALE_ENTRY_OVERLOAD(mean, dim),
    MEMSCALE_ENTRY_OVERLOAD(where, self),
    MEMSCALE_ENTRY_OVERLOAD(masked_fill, Scalar),
    MEMSCALE_ENTRY(clone),
    MEMSCALE_ENTRY(_to_copy),
    MEMSCALE_ENTRY(view),
    MEMSCALE_ENTRY(_unsafe_view),
    MEMSCALE_ENTRY(expand),
    MEMSCALE_ENTRY(t),
    MEMSCALE_ENTRY_OVERLOAD(transpose, int),
    MEMSCALE_ENTRY(permute),
    MEMSCALE_ENTRY(unsqueeze),
    MEMSCALE_ENTRY_OVERLOAD(squeeze, dim),
    MEMSCALE_ENTRY_OVERLOAD(select, int),
    MEMSCALE_ENTRY_OVERLOAD(slice, Tensor),
    MEMSCALE_ENTRY_OVERLOAD(split, Tensor),
    MEMSCALE_ENTRY(detach),
    MEMSCALE_ENTRY(alias),
    MEMSCALE_ENTRY(lift_fresh),
    // Losses, convolutions, pooling and attention (the CPU's and each CUDA
    // backend's kernels and their backward ones).
    MEMSCALE_ENTRY(_log_softmax),
    MEMSCALE_ENTRY(_log_softmax_backward_data),
    MEMSCALE_ENTRY(nll_loss_forward),
    MEMSCALE_ENTRY(nll_loss_backward),
    MEMSCALE_ENTRY(convolution),
    MEMSCALE_ENTRY(convolution_backward),
    MEMSCALE_ENTRY(cudnn_convolution),
    MEMSCALE_ENTRY(max_pool2d_with_indices),
    MEMSCALE_ENTRY(max_pool2d_with_indices_backward),
    MEMSCALE_ENTRY(avg_pool2d),
    MEMSCALE_ENTRY(avg_pool2d_backward),
    MEMSCALE_ENTRY(baddbmm),
    MEMSCALE_ENTRY(sigmoid_backward),
    MEMSCALE_ENTRY(_scaled_dot_product_efficient_attention),
    MEMSCALE_ENTRY(_scaled_dot_product_efficient_attention_backward),
    MEMSCALE_ENTRY(_scaled_dot_product_flash_attention),
    MEMSCALE_ENTRY(_scaled_dot_product_flash_attention_backward),
    MEMSCALE_ENTRY(_scaled_dot_product_flash_attention_for_cpu),
    MEMSCALE_ENTRY(_scaled_dot_product_flash_attention_for_cpu_backward),
    MEMSCALE_ENTRY(_scaled_dot_product_cudnn_attention),
    MEMSCALE_ENTRY(_scaled_dot_product_cudnn_attention_backward),
    // What other families' steps call most: elementwise math and reductions,
    // gathers and splits, more activations and losses with their backward
    // kernels, group and RMS normalization (CUDA's fused kernel), nearest
    // upsampling, batch normalization's non-mutating kernels.
    MEMSCALE_ENTRY(sqrt),
    MEMSCALE_ENTRY(log),
    MEMSCALE_ENTRY(abs),
    MEMSCALE_ENTRY_OVERLOAD(rsub, Scalar),
    MEMSCALE_ENTRY(clamp),
    MEMSCALE_ENTRY(minimum),
    MEMSCALE_ENTRY(maximum),
    MEMSCALE_ENTRY(amax),
    MEMSCALE_ENTRY(sum),
    MEMSCALE_ENTRY(mean),
    MEMSCALE_ENTRY(cumsum),
    MEMSCALE_ENTRY(sin),
    MEMSCALE_ENTRY(cos),
    MEMSCALE_ENTRY(index_select),
    MEMSCALE_ENTRY(gather),
    MEMSCALE_ENTRY_OVERLOAD(unbind, int),
    MEMSCALE_ENTRY(split_with_sizes),
    MEMSCALE_ENTRY(_reshape_alias),
    MEMSCALE_ENTRY(mse_loss),
    MEMSCALE_ENTRY(mse_loss_backward),
    MEMSCALE_ENTRY(leaky_relu),
    MEMSCALE_ENTRY(leaky_relu_backward),
    MEMSCALE_ENTRY(hardtanh),
    MEMSCALE_ENTRY(hardtanh_backward),
    MEMSCALE_ENTRY(softplus),
    MEMSCALE_ENTRY(softplus_backward),
    MEMSCALE_ENTRY(elu),
    MEMSCALE_ENTRY(elu_backward),
    MEMSCALE_ENTRY(hardswish),
    MEMSCALE_ENTRY(hardswish_backward),
    MEMSCALE_ENTRY(log_sigmoid_forward),
    MEMSCALE_ENTRY(log_sigmoid_backward),
    MEMSCALE_ENTRY(native_group_norm),
    MEMSCALE_ENTRY(native_group_norm_backward),
    MEMSCALE_ENTRY(_fused_rms_norm),
    MEMSCALE_ENTRY(_fused_rms_norm_backward),
    MEMSCALE_ENTRY(upsample_nearest2d),
    MEMSCALE_ENTRY(upsample_nearest2d_backward),
    MEMSCALE_ENTRY(native_batch_norm_backward),
    MEMSCALE_ENTRY(cudnn_batch_norm_backward),
    MEMSCALE_ENTRY(_native_batch_norm_legit_no_training),
};

#undef MEMSCALE_ENTRY
#undef MEMSCALE_ENTRY_OVERLOAD

}  // namespace

c10::optional<UnboxedKernel> unboxed_kernel(const std::string& name, const std::string& overload) {
  for (const Listed& l : kListed) {
    if (name == l.name && overload == l.overload) return l.make();
  }
  return c10::nullopt;
}

}  // namespace memscale
