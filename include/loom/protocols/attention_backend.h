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
  // Training with multi-token prediction (models/mtp.h): for each local token, the token
  // 1, 2, ..., D places ahead in its document (0 where there is none), the depths side by side in
  // each row: [b, D s] int64. Undefined: no prediction beyond the next token.
  at::Tensor mtp_tokens;

  bool trivial() const {
    return !positions.defined() && !documents.defined() && !slots.defined() &&
           !mtp_tokens.defined();
  }
};

// What one layer adds to the batch's mask (gpt-oss alternates sliding and full layers, every
// layer with sinks). The default, plain, is causal attention as the layout says.
struct LayerAttention {
  // > 0: a query sees only the keys at row slots (slot - window, slot], at most `window` keys,
  // itself included (transformers' `sliding_window`: kv_idx > q_idx - window); 0: every earlier
  // key. Slots, not RoPE positions, so packed documents and context-parallel chunks agree.
  int64_t window = 0;
  // [h] learned logits, one per query head of this rank, that join each row's softmax
  // denominator and nothing else: out = sum_j e^(s_j) v_j / (e^(sink) + sum_j e^(s_j)). They
  // get gradients. Undefined: no sinks.
  at::Tensor sinks;

  bool plain() const { return window == 0 && !sinks.defined(); }
};

// q [b, h, s, d], k [b, hk, t, d], v [b, hk, t, dv] -> [b, h, s, dv], the softmax scaled by
// `scale`; `layout` describes the s query tokens, `layer` this layer's window and sinks.
// Grouped-query attention: hk divides h and q head j reads k/v head j / (h / hk); backends
// expand the heads after any communication, so context parallelism moves hk heads, not h.
using AttentionBackend =
    std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             double scale, const TokenLayout& layout, const LayerAttention& layer)>;

// What every attention layer of one forward shares: the RoPE table, each token's rotation when
// the layout gives positions, the layout and the backend.
struct AttentionInputs {
  at::Tensor freqs_cis;  // [>= s, rope_dim / 2] complex
  at::Tensor
      rotations;  // [b, s, rope_dim / 2]: freqs_cis at layout.positions; undefined: rows 0..s-1
  TokenLayout layout;
  const AttentionBackend* backend = nullptr;  // null or empty: local_attention

  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                    const LayerAttention& layer = {}) const;
};

// k or v [b, hk, t, d] -> [b, heads, t, d], each head repeated heads / hk times in place
// (differentiable: backward sums each group); `fold_heads` is that sum for gradients computed
// outside autograd.
at::Tensor expand_heads(const at::Tensor& x, int64_t heads);
at::Tensor fold_heads(const at::Tensor& grad, int64_t kv_heads);

// Attention over the local tokens alone (t == s): SDPA's causal kernel for a trivial layout and
// a plain layer (bitwise what it always was); on CUDA, packed documents and sliding windows
// through FlashAttention's variable-length kernels where they apply (varlen_attention.h); else
// masked_attention with the layout's slots and documents and the layer's window and sinks.
at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale, const TokenLayout& layout,
                           const LayerAttention& layer = {});

// The largest attention logit (scale * q.k over the pairs the mask lets attend) of each query
// head, over the batch, queries and keys: [h] float, -inf for a head that saw no key. No
// autograd; q [b, h, s, d], k [b, hk, s, d] of the local tokens (not under context parallelism),
// the mask as local_attention's. Scores are formed a block of queries at a time (at most
// `score_budget` floats, one block row at least), never as one [s, s] matrix: QK-clip's statistic
// (MuonClip).
at::Tensor max_attention_logits(const at::Tensor& q, const at::Tensor& k, double scale,
                                const TokenLayout& layout, const LayerAttention& layer = {},
                                int64_t score_budget = int64_t{1} << 24);

// Who may attend to whom, bool [b or 1, 1, s, t]: key slot <= query slot, the same document
// when documents are given (query_documents [b, s] and key_documents [b, t], or undefined), and
// key slot > query slot - window when window > 0. The dense reference; kernels use it per tile.
at::Tensor causal_mask(const at::Tensor& query_slots, const at::Tensor& key_slots,
                       const at::Tensor& query_documents, const at::Tensor& key_documents,
                       int64_t window = 0);

// Who may attend to whom, as the small tensors that make the mask (causal_mask's arguments, on
// any device; documents undefined: one document per row). Slots need not be sorted (context
// parallelism gathers keys in rank order).
struct MaskDescription {
  at::Tensor query_slots, key_slots;                 // [s], [t]
  at::Tensor query_documents, key_documents;         // [b, s], [b, t]
  int64_t window = 0;                                // LayerAttention::window
  at::Tensor build(const at::Device& device) const;  // bool [b or 1, 1, s, t] on `device`
  // The same description for queries [q0, q1) and keys [k0, k1).
  MaskDescription tile(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const;
};

// Attention under the described mask, with the layer's sinks ([h], undefined: none;
// differentiable). On the CPU through the blocked kernel (attention_kernel.h), keeping only q,
// k, v, the output and its log-sum-exp for backward: no [s, t] mask exists at any time. Elsewhere
// SDPA with the dense mask, or float matmuls when there are sinks.
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale, const MaskDescription& where,
                            const at::Tensor& sinks = {});

// Softmax attention and its log-sum-exp under a described mask, no autograd: the pieces a caller
// merges (the ring of context parallelism) or differentiates itself. A row that sees no key gets
// out 0 and lse -inf. CPU: the blocked kernel (key blocks outside the mask skipped); elsewhere
// float matmuls over the dense [s, t] scores.
struct AttentionPartial {
  at::Tensor out;  // [b, h, s, dv]
  at::Tensor lse;  // [b, h, s, 1]
};
AttentionPartial attention_partial(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   double scale, const MaskDescription& where);

// The gradients of q, k and v of one partial given the *final* output and log-sum-exp of the
// rows (P = e^(S - lse), dS = P (dP - rowsum(dout * out))): summed over the partials of a row
// they are the gradients of the merged attention. Sinks only change the final lse.
std::array<at::Tensor, 3> attention_partial_backward(const at::Tensor& dout, const at::Tensor& q,
                                                     const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& out, const at::Tensor& lse,
                                                     double scale, const MaskDescription& where);

// The partial and its backward over the dense [s, t] scores, in float32 whatever the inputs'
// dtype and with autocast off (attention_partial's path off the CPU; callable on the CPU for
// its tests). out and the gradients come back in the inputs' dtypes, lse in float32.
AttentionPartial dense_attention_partial(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, double scale,
                                         const MaskDescription& where);
std::array<at::Tensor, 3> dense_attention_partial_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, double scale, const MaskDescription& where);

// Sinks as one more partial with no value: lse' = logaddexp(lse, sink_h), out' = out e^(lse -
// lse'). In place of `p`; sinks [h] float. A row that saw no key keeps out 0 and gets lse = sink.
void merge_sinks(AttentionPartial& p, const at::Tensor& sinks);
// d sink_h = -sum over rows of e^(sink_h - lse) rowsum(dout * out), with the final out and lse.
at::Tensor sinks_backward(const at::Tensor& dout, const at::Tensor& out, const at::Tensor& lse,
                          const at::Tensor& sinks);

}  // namespace loom::models
