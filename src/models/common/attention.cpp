#include "loom/models/common/attention.h"

#include <ATen/ATen.h>

#include <cmath>
#include <tuple>

#include "loom/core/check.h"
#include "loom/models/common/rope.h"
#include "loom/protocols/shared_input.h"

namespace loom::models {

AttentionImpl::AttentionImpl(const DecoderArgs& args, const at::TensorOptions& options,
                             int64_t layer)
    : window(args.window(layer)),
      has_sinks(args.attention_sinks),
      n_heads(args.n_heads),
      n_kv_heads(args.kv_heads()),
      head_dim(args.head_dim()),
      rope_layout(args.rope_layout) {
  const bool bias = args.attention_bias;
  wq = register_module("wq", Linear(args.dim, n_heads * head_dim, options, bias));
  wk = register_module("wk", Linear(args.dim, n_kv_heads * head_dim, options, bias));
  wv = register_module("wv", Linear(args.dim, n_kv_heads * head_dim, options, bias));
  wo = register_module("wo", Linear(n_heads * head_dim, args.dim, options, bias));
  if (args.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim, args.norm_eps, options));
    k_norm = register_module("k_norm", RMSNorm(head_dim, args.norm_eps, options));
  }
  if (has_sinks) register_parameter("sinks", at::zeros({n_heads}, options));
}

at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) {
    return x;
  }
  const auto bs = x.size(0), seq = x.size(1), heads = x.size(2), dim = x.size(3);
  return x.unsqueeze(3).expand({bs, seq, heads, n_rep, dim}).reshape({bs, seq, heads * n_rep, dim});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> AttentionImpl::project(const at::Tensor& x) {
  const auto bs = x.size(0), seq = x.size(1);
  // Head counts come from the projections' shapes: under tensor parallelism wq/wk/wv hold a
  // contiguous range of this rank's heads (query heads and their kv heads together).
  const SharedInputScope shared(x);  // three projections of one x (float8: one cast)
  at::Tensor q = wq->forward(x).view({bs, seq, -1, head_dim});
  at::Tensor k = wk->forward(x).view({bs, seq, -1, head_dim});
  at::Tensor v = wv->forward(x).view({bs, seq, -1, head_dim});
  if (q_norm) {
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  return {q, k, v};
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const AttentionInputs& in) {
  const auto bs = x.size(0), seq = x.size(1);
  auto [q, k, v] = project(x);
  const int64_t local_heads = q.size(2);
  if (in.rotations.defined()) {  // positions of the layout (documents, context-parallel chunks)
    q = apply_rotary_emb_at(q, in.rotations, rope_layout);
    k = apply_rotary_emb_at(k, in.rotations, rope_layout);
  } else {
    std::tie(q, k) = rotate_qk(q, k, in.freqs_cis, rope_layout);
  }
  // Sinks are per query head: tensor parallelism splits them with wq's heads.
  LOOM_CHECK(!has_sinks || sinks().size(0) == local_heads, "attention sinks for ", sinks().size(0),
             " heads, but this rank computes ", local_heads);
  // The backend takes [bs, heads, seq, head_dim], k and v with their own (grouped) heads; on
  // CUDA SDPA picks flash / memory-efficient.
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const LayerAttention layer{window, sinks()};
  max_logits.observe(is_training(), q.transpose(1, 2), k.transpose(1, 2), scale, in, layer);
  at::Tensor out = in.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale, layer);
  return wo->forward(out.transpose(1, 2).contiguous().view({bs, seq, local_heads * head_dim}));
}

at::Tensor AttentionImpl::forward_cached(const at::Tensor& x, const at::Tensor& rotations,
                                         at::Tensor& keys, at::Tensor& values, int64_t start,
                                         const at::Tensor& mask, const at::Tensor& padding) {
  const auto bs = x.size(0), seq = x.size(1);
  auto [q_raw, k_raw, v] = project(x);
  at::Tensor q = apply_rotary_emb_at(q_raw, rotations, rope_layout);
  at::Tensor k = apply_rotary_emb_at(k_raw, rotations, rope_layout);
  keys.slice(2, start, start + seq).copy_(k.transpose(1, 2));
  values.slice(2, start, start + seq).copy_(v.transpose(1, 2));
  const int64_t used = start + seq, n_rep = n_heads / n_kv_heads;
  auto expand_heads = [&](const at::Tensor& cached) {
    at::Tensor t = cached.slice(2, 0, used);
    if (n_rep == 1) return t;
    return t.unsqueeze(2)
        .expand({bs, n_kv_heads, n_rep, used, head_dim})
        .reshape({bs, n_heads, used, head_dim});
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  at::Tensor out;
  if (window > 0 || has_sinks) {
    // The training path's mask over the cache's slots: causal, this layer's window, and a left-
    // padded row's padding as a document of its own that no real token attends to.
    const auto slots = at::TensorOptions().dtype(at::kLong).device(x.device());
    MaskDescription where;
    where.query_slots = at::arange(start, used, slots);
    where.key_slots = at::arange(used, slots);
    where.query_documents = at::zeros({bs, seq}, slots);
    where.key_documents =
        padding.defined() ? -(where.key_slots.view({1, used}) < padding.view({bs, 1})).to(at::kLong)
                          : at::zeros({bs, used}, slots);
    where.window = window;
    out = masked_attention(q.transpose(1, 2), expand_heads(keys), expand_heads(values), scale,
                           where, sinks());
  } else {
    const bool causal = !mask.defined() && start == 0 && seq > 1;
    out = at::scaled_dot_product_attention(
        q.transpose(1, 2), expand_heads(keys), expand_heads(values),
        mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt, 0.0, causal);
  }
  return wo->forward(out.transpose(1, 2).contiguous().view({bs, seq, n_heads * head_dim}));
}

void MaxLogits::observe(bool training, const at::Tensor& q, const at::Tensor& k, double scale,
                        const AttentionInputs& in, const LayerAttention& layer) {
  if (!enabled || !training || !at::GradMode::is_enabled()) return;
  const at::Tensor step = max_attention_logits(q, k, scale, in.layout, layer);
  per_head = per_head.defined() ? at::maximum(per_head, step) : step;
}

}  // namespace loom::models
