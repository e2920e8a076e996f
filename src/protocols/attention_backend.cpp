#include "loom/protocols/attention_backend.h"

#include "loom/core/check.h"
#include "loom/protocols/attention_kernel.h"
#include "loom/protocols/sdpa_choice.h"
#include "loom/protocols/varlen_attention.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <optional>

namespace loom::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();

at::Tensor masked_scores(const at::Tensor& q, const at::Tensor& k, double scale,
                         const at::Tensor& mask) {
  return at::matmul(q, k.transpose(-2, -1))
      .mul_(scale)
      .masked_fill_(mask.logical_not(), kMinusInfinity);
}

// Attention under a mask described by slots, documents and a window, with optional sinks;
// backward recomputes from the description instead of keeping a mask (a float [s, t] mask per
// layer would outweigh the layer's other activations at long sequences).
struct MaskedAttention : torch::autograd::Function<MaskedAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const std::optional<at::Tensor>& sinks,
                            double scale, const MaskDescription& where) {
    AttentionPartial p = attention_partial(q, k, v, scale, where);
    if (sinks) merge_sinks(p, *sinks);
    ctx->save_for_backward({q, k, v, p.out, p.lse, sinks.value_or(at::Tensor())});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["query_slots"] = where.query_slots;
    ctx->saved_data["key_slots"] = where.key_slots;
    ctx->saved_data["query_documents"] = where.query_documents;
    ctx->saved_data["key_documents"] = where.key_documents;
    ctx->saved_data["window"] = where.window;
    return p.out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    MaskDescription where{
        ctx->saved_data["query_slots"].toTensor(), ctx->saved_data["key_slots"].toTensor(),
        ctx->saved_data["query_documents"].toTensor(), ctx->saved_data["key_documents"].toTensor(),
        ctx->saved_data["window"].toInt()};
    const at::Tensor dout = grads[0].contiguous();
    auto [dq, dk, dv] =
        attention_partial_backward(dout, saved[0], saved[1], saved[2], saved[3], saved[4],
                                   ctx->saved_data["scale"].toDouble(), where);
    at::Tensor dsinks;
    if (saved[5].defined()) dsinks = sinks_backward(dout, saved[3], saved[4], saved[5]);
    return {dq, dk, dv, dsinks, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor MaskDescription::build(const at::Device& device) const {
  auto on = [&](const at::Tensor& t) { return t.defined() ? t.to(device) : t; };
  return causal_mask(on(query_slots), on(key_slots), on(query_documents), on(key_documents),
                     window);
}

MaskDescription MaskDescription::tile(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const {
  MaskDescription part{
      query_slots.narrow(0, q0, q1 - q0), key_slots.narrow(0, k0, k1 - k0), {}, {}, window};
  if (query_documents.defined()) {
    part.query_documents = query_documents.narrow(1, q0, q1 - q0);
    part.key_documents = key_documents.narrow(1, k0, k1 - k0);
  }
  return part;
}

// Both directions compute in float32 whatever the inputs' dtype, with autocast off: under
// autocast the matmuls would run in bf16 beside a float32 logsumexp (the backward, outside the
// autocast region, then mixed the two and failed), and bf16 softmax statistics scale whole rows
// wrongly.
AttentionPartial dense_attention_partial(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, double scale,
                                         const MaskDescription& where) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  at::NoGradGuard no_grad;
  AttentionPartial p;
  const at::Tensor scores =
      masked_scores(q.to(at::kFloat), k.to(at::kFloat), scale, where.build(q.device()));
  p.lse = scores.logsumexp(-1, /*keepdim=*/true);
  p.out = at::matmul((scores - p.lse.masked_fill(p.lse.isinf(), 0.0)).exp_(), v.to(at::kFloat))
              .to(q.scalar_type());
  return p;
}

std::array<at::Tensor, 3> dense_attention_partial_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, double scale, const MaskDescription& where) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  at::NoGradGuard no_grad;
  const at::Tensor qf = q.to(at::kFloat), kf = k.to(at::kFloat), vf = v.to(at::kFloat);
  const at::Tensor doutf = dout.to(at::kFloat), lsef = lse.to(at::kFloat);
  const at::Tensor shift = lsef.masked_fill(lsef.isinf(), 0.0);
  const at::Tensor p = (masked_scores(qf, kf, scale, where.build(q.device())) - shift).exp_();
  const at::Tensor dv = at::matmul(p.transpose(-2, -1), doutf);
  const at::Tensor delta = (doutf * out.to(at::kFloat)).sum(-1, /*keepdim=*/true);
  const at::Tensor ds = p.mul_(at::matmul(doutf, vf.transpose(-2, -1)).sub_(delta)).mul_(scale);
  return {at::matmul(ds, kf).to(q.scalar_type()),
          at::matmul(ds.transpose(-2, -1), qf).to(k.scalar_type()), dv.to(v.scalar_type())};
}

AttentionPartial attention_partial(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   double scale, const MaskDescription& where) {
  if (!q.is_cpu()) return dense_attention_partial(q, k, v, scale, where);
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return blocked_attention(q, k, v, scale, where);
}

std::array<at::Tensor, 3> attention_partial_backward(const at::Tensor& dout, const at::Tensor& q,
                                                     const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& out, const at::Tensor& lse,
                                                     double scale, const MaskDescription& where) {
  if (!q.is_cpu()) return dense_attention_partial_backward(dout, q, k, v, out, lse, scale, where);
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return blocked_attention_backward(dout, q, k, v, out, lse, scale, where);
}

void merge_sinks(AttentionPartial& p, const at::Tensor& sinks) {
  const at::Tensor sink = sinks.to(p.lse.options()).view({1, -1, 1, 1});
  const at::Tensor merged = at::logaddexp(p.lse, sink);
  // A row that saw no key has out 0 and lse -inf: e^(-inf - sink) = 0 keeps it 0.
  p.out = p.out * (p.lse - merged).exp().to(p.out.scalar_type());
  p.lse = merged;
}

at::Tensor sinks_backward(const at::Tensor& dout, const at::Tensor& out, const at::Tensor& lse,
                          const at::Tensor& sinks) {
  const at::Tensor delta = (dout.to(at::kFloat) * out.to(at::kFloat)).sum(-1, /*keepdim=*/true);
  const at::Tensor weight = (sinks.to(at::kFloat).view({1, -1, 1, 1}) - lse.to(at::kFloat)).exp();
  return (weight * delta).sum({0, 2, 3}).neg().to(sinks.scalar_type());
}

at::Tensor causal_mask(const at::Tensor& query_slots, const at::Tensor& key_slots,
                       const at::Tensor& query_documents, const at::Tensor& key_documents,
                       int64_t window) {
  const at::Tensor keys = key_slots.view({1, 1, 1, -1}), queries = query_slots.view({1, 1, -1, 1});
  at::Tensor allowed = keys <= queries;
  if (window > 0) allowed = allowed & (keys > queries - window);
  if (query_documents.defined()) {
    const int64_t b = query_documents.size(0);
    allowed = allowed & (query_documents.view({b, 1, -1, 1}) == key_documents.view({b, 1, 1, -1}));
  }
  return allowed;
}

at::Tensor expand_heads(const at::Tensor& x, int64_t heads) {
  const int64_t kv_heads = x.size(1);
  if (kv_heads == heads) return x;
  LOOM_CHECK(heads % kv_heads == 0, heads, " query heads do not group into ", kv_heads,
             " key/value heads");
  const int64_t b = x.size(0), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv_heads, heads / kv_heads, t, d}).reshape({b, heads, t, d});
}

at::Tensor fold_heads(const at::Tensor& grad, int64_t kv_heads) {
  const int64_t heads = grad.size(1);
  if (kv_heads == heads) return grad;
  return grad.reshape({grad.size(0), kv_heads, heads / kv_heads, grad.size(2), grad.size(3)})
      .sum(2);
}

at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale, const TokenLayout& layout, const LayerAttention& layer) {
  if (varlen_attention_applies(q, k, v, layout, layer)) {
    if (auto sequences = batch_sequences(layout.documents, q.size(0), q.size(2), q.device())) {
      return varlen_attention(q, k, v, scale, *sequences, layer.window);
    }
  }
  const at::Tensor keys = expand_heads(k, q.size(1)), values = expand_heads(v, q.size(1));
  if (!layout.documents.defined() && !layout.slots.defined() && layer.plain()) {
    if (q.is_cuda()) return causal_fused_attention(q, keys, values, scale);
    return at::scaled_dot_product_attention(q, keys, values, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, scale);
  }
  const at::Tensor slots = layout.slots.defined() ? layout.slots : at::arange(q.size(2), at::kLong);
  return masked_attention(q, keys, values, scale,
                          {slots, slots, layout.documents, layout.documents, layer.window},
                          layer.sinks);
}

at::Tensor max_attention_logits(const at::Tensor& q, const at::Tensor& k, double scale,
                                const TokenLayout& layout, const LayerAttention& layer,
                                int64_t score_budget) {
  at::NoGradGuard no_grad;
  // In float32 under autocast too: QK-clip compares this with its threshold.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t b = q.size(0), h = q.size(1), s = q.size(2), t = k.size(2);
  LOOM_CHECK(t == s && !layout.key_slots.defined(),
             "max_attention_logits takes the local tokens' keys (no context parallelism)");
  const at::Tensor keys = expand_heads(k, h).to(at::kFloat);
  const at::Tensor slots =
      layout.slots.defined() ? layout.slots : at::arange(s, q.options().dtype(at::kLong));
  const MaskDescription where{slots, slots, layout.documents, layout.documents, layer.window};
  const int64_t block = std::max<int64_t>(1, score_budget / std::max<int64_t>(1, b * h * t));
  at::Tensor best = at::full({h}, kMinusInfinity, q.options().dtype(at::kFloat));
  for (int64_t q0 = 0; q0 < s; q0 += block) {
    const int64_t q1 = std::min(s, q0 + block);
    const at::Tensor scores = masked_scores(q.slice(2, q0, q1).to(at::kFloat), keys, scale,
                                            where.tile(q0, q1, 0, t).build(q.device()));
    best = at::maximum(best, scores.amax({0, 2, 3}));
  }
  return best;
}

at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale, const MaskDescription& where, const at::Tensor& sinks) {
  LOOM_CHECK(!sinks.defined() || sinks.numel() == q.size(1), "attention sinks: ", sinks.numel(),
             " for ", q.size(1), " query heads");
  if (q.is_cpu() || sinks.defined()) {
    // Autograd functions take an absent tensor as nullopt, not as an undefined tensor.
    const auto maybe_sinks = sinks.defined() ? std::optional<at::Tensor>(sinks) : std::nullopt;
    return MaskedAttention::apply(q, k, v, maybe_sinks, scale, where);
  }
  return at::scaled_dot_product_attention(q, k, v, where.build(q.device()), 0.0,
                                          /*is_causal=*/false, scale);
}

at::Tensor AttentionInputs::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   double scale, const LayerAttention& layer) const {
  return backend && *backend ? (*backend)(q, k, v, scale, layout, layer)
                             : local_attention(q, k, v, scale, layout, layer);
}

}  // namespace loom::models
