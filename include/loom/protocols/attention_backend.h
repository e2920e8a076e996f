// The seam between the model and how attention is computed. Every attention layer hands its
// q, k, v and the batch's TokenLayout (where each token sits: RoPE position, document, slot of
// the whole row) to one AttentionBackend. The default runs SDPA on the local tokens; context
// parallelism (parallel/context_parallel.h) installs one that brings the other ranks' keys and
// values, without the model knowing.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <functional>

namespace loom::models {

struct TokenLayout {
  // RoPE position of each token [b, s] int64; undefined: 0, 1, ..., s-1 in every row.
  at::Tensor positions;
  // Document index of each token within its row [b, s] int64: a token attends only to earlier
  // tokens of its own document (block_causal). Undefined: one document per row (causal).
  at::Tensor documents;
  // Index of each of the s local tokens in the whole row [s] int64, increasing (context
  // parallelism's chunks). Undefined: 0, 1, ..., s-1.
  at::Tensor slots;
  // Under context parallelism, the keys' slots [t] and documents [b, t] (undefined: the queries').
  at::Tensor key_slots;
  at::Tensor key_documents;

  bool trivial() const { return !positions.defined() && !documents.defined() && !slots.defined(); }
};

// q [b, h, s, d], k [b, hk, t, d], v [b, hk, t, dv] -> [b, h, s, dv], the softmax scaled by
// `scale`; `layout` describes the s query tokens. Grouped-query attention: hk divides h and q
// head j reads k/v head j / (h / hk); backends expand the heads after any communication, so
// context parallelism moves hk heads, not h.
using AttentionBackend =
    std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             double scale, const TokenLayout& layout)>;

// What every attention layer of one forward shares: the RoPE table, each token's rotation when
// the layout gives positions, the layout and the backend.
struct AttentionInputs {
  at::Tensor freqs_cis;  // [>= s, rope_dim / 2] complex
  at::Tensor
      rotations;  // [b, s, rope_dim / 2]: freqs_cis at layout.positions; undefined: rows 0..s-1
  TokenLayout layout;
  const AttentionBackend* backend = nullptr;  // null or empty: local_attention

  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    double scale) const;
};

// k or v [b, hk, t, d] -> [b, heads, t, d], each head repeated heads / hk times in place
// (differentiable: backward sums each group); `fold_heads` is that sum for gradients computed
// outside autograd.
at::Tensor expand_heads(const at::Tensor& x, int64_t heads);
at::Tensor fold_heads(const at::Tensor& grad, int64_t kv_heads);

// Attention over the local tokens alone (t == s): SDPA's causal kernel for a trivial layout,
// else with causal_mask of the layout's slots and documents.
at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale, const TokenLayout& layout);

// Who may attend to whom, bool [b or 1, 1, s, t]: key slot <= query slot, and the same document
// when documents are given (query_documents [b, s] and key_documents [b, t], or undefined).
at::Tensor causal_mask(const at::Tensor& query_slots, const at::Tensor& key_slots,
                       const at::Tensor& query_documents, const at::Tensor& key_documents);

// Who may attend to whom, as the small tensors that make the mask (causal_mask's arguments, on
// any device; documents undefined: one document per row).
struct MaskDescription {
  at::Tensor query_slots, key_slots;                 // [s], [t]
  at::Tensor query_documents, key_documents;         // [b, s], [b, t]
  at::Tensor build(const at::Device& device) const;  // bool [b or 1, 1, s, t] on `device`
};

// Attention under the described mask. On the CPU through the fused flash kernel, keeping only
// q, k, v, the output and its log-sum-exp for backward, which rebuilds the mask: SDPA would keep
// the mask as a float [s, t] per layer, more than the layer's other activations at long
// sequences. Elsewhere SDPA with the mask.
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale, const MaskDescription& where);

// Softmax attention and its log-sum-exp under a bool mask [b or 1, 1, s, t], no autograd: the
// pieces a caller merges (the ring of context parallelism) or differentiates itself. A row that
// sees no key gets out 0 and lse -inf. CPU: the fused flash kernel (value heads of another size
// are zero-padded); elsewhere float matmuls over the [s, t] scores.
struct AttentionPartial {
  at::Tensor out;  // [b, h, s, dv]
  at::Tensor lse;  // [b, h, s, 1]
};
AttentionPartial attention_partial(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   double scale, const at::Tensor& mask);

// The gradients of q, k and v of one partial given the *final* output and log-sum-exp of the
// rows (P = e^(S - lse), dS = P (dP - rowsum(dout * out))): summed over the partials of a row
// they are the gradients of the merged attention.
std::array<at::Tensor, 3> attention_partial_backward(const at::Tensor& dout, const at::Tensor& q,
                                                     const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& out, const at::Tensor& lse,
                                                     double scale, const at::Tensor& mask);

}  // namespace loom::models
