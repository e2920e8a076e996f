// Rotary position embedding of q and k in one pass, as one fused CPU kernel (forward and
// backward).
//
// ATen applies RoPE as a complex multiply per tensor (view_as_complex, mul by the broadcast
// rotations, view_as_real), and in backward multiplies by the conjugate through the complex
// autograd formulas. The fused kernel rotates q's and k's heads at each position with the
// position's cos/sin loaded once, and its backward is the same pass by the inverse angle; it
// saves nothing but the rotations. Split over positions on LibTorch's intra-op threads. Anything
// else (not CPU, not float32, not contiguous, an odd or very wide head) takes the complex path.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace loom::models::kernels {

// q [bs, seq, q_heads, head_dim] and k [bs, seq, kv_heads, head_dim] rotated by freqs_cis
// [>= seq, head_dim / 2] (complex64), differentiable in q and k.
std::pair<at::Tensor, at::Tensor> rotary_qk(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& freqs_cis);

// True when rotary_qk takes the fused kernel for these inputs.
bool rotary_is_fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& freqs_cis);

}  // namespace loom::models::kernels
