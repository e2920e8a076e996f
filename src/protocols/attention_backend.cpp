#include "loom/protocols/attention_backend.h"

#include "loom/core/check.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>

namespace loom::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();

at::Tensor additive(const at::Tensor& mask, const at::Tensor& like) {
  return at::zeros(mask.sizes(), like.options()).masked_fill_(mask.logical_not(), kMinusInfinity);
}

at::Tensor masked_scores(const at::Tensor& q, const at::Tensor& k, double scale,
                         const at::Tensor& mask) {
  return at::matmul(q, k.transpose(-2, -1))
      .mul_(scale)
      .masked_fill_(mask.logical_not(), kMinusInfinity);
}

// The fused kernel takes one head size: zero columns change neither the scores (q and k padded
// together) nor the values' columns that are kept (multi-head latent attention has dv != d).
at::Tensor widen(const at::Tensor& x, int64_t width) {
  return x.size(-1) == width ? x : at::constant_pad_nd(x, {0, width - x.size(-1)});
}
at::Tensor narrow_to(const at::Tensor& x, int64_t width) {
  return x.size(-1) == width ? x : x.narrow(-1, 0, width);
}

// Attention under a mask described by slots and documents; backward rebuilds the mask instead of
// keeping it (a float [s, t] mask per layer would outweigh the layer's other activations at long
// sequences).
struct MaskedAttention : torch::autograd::Function<MaskedAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale, const MaskDescription& where) {
    const AttentionPartial p = attention_partial(q, k, v, scale, where.build(q.device()));
    ctx->save_for_backward({q, k, v, p.out, p.lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["query_slots"] = where.query_slots;
    ctx->saved_data["key_slots"] = where.key_slots;
    ctx->saved_data["query_documents"] = where.query_documents;
    ctx->saved_data["key_documents"] = where.key_documents;
    return p.out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    MaskDescription where{
        ctx->saved_data["query_slots"].toTensor(), ctx->saved_data["key_slots"].toTensor(),
        ctx->saved_data["query_documents"].toTensor(), ctx->saved_data["key_documents"].toTensor()};
    auto [dq, dk, dv] = attention_partial_backward(
        grads[0].contiguous(), saved[0], saved[1], saved[2], saved[3], saved[4],
        ctx->saved_data["scale"].toDouble(), where.build(saved[0].device()));
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor MaskDescription::build(const at::Device& device) const {
  auto on = [&](const at::Tensor& t) { return t.defined() ? t.to(device) : t; };
  return causal_mask(on(query_slots), on(key_slots), on(query_documents), on(key_documents));
}

AttentionPartial attention_partial(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   double scale, const at::Tensor& mask) {
  AttentionPartial p;
  if (q.is_cpu()) {
    const int64_t width = std::max(q.size(-1), v.size(-1));
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
        widen(q, width), widen(k, width), widen(v, width), 0.0, /*is_causal=*/false,
        additive(mask, q), scale);
    // The kernel reports 0 for a row that sees no key; the merge needs -inf there.
    const at::Tensor blind = mask.any(-1, /*keepdim=*/true).logical_not();
    p.out = narrow_to(out, v.size(-1));
    p.lse = lse.unsqueeze(-1).masked_fill(blind, kMinusInfinity);
    return p;
  }
  const at::Tensor scores = masked_scores(q, k, scale, mask);
  p.lse = scores.logsumexp(-1, /*keepdim=*/true);
  p.out = at::matmul((scores - p.lse.masked_fill(p.lse.isinf(), 0.0)).exp_(), v);
  return p;
}

std::array<at::Tensor, 3> attention_partial_backward(const at::Tensor& dout, const at::Tensor& q,
                                                     const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& out, const at::Tensor& lse,
                                                     double scale, const at::Tensor& mask) {
  if (q.is_cpu()) {
    const int64_t width = std::max(q.size(-1), v.size(-1));
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        widen(dout, width), widen(q, width), widen(k, width), widen(v, width), widen(out, width),
        lse.squeeze(-1), 0.0, /*is_causal=*/false, additive(mask, q), scale);
    return {narrow_to(dq, q.size(-1)), narrow_to(dk, k.size(-1)), narrow_to(dv, v.size(-1))};
  }
  const at::Tensor p = (masked_scores(q, k, scale, mask) - lse).exp_();
  const at::Tensor dv = at::matmul(p.transpose(-2, -1), dout);
  const at::Tensor delta = (dout * out).sum(-1, /*keepdim=*/true);
  const at::Tensor ds = p.mul_(at::matmul(dout, v.transpose(-2, -1)).sub_(delta)).mul_(scale);
  return {at::matmul(ds, k), at::matmul(ds.transpose(-2, -1), q), dv};
}

at::Tensor causal_mask(const at::Tensor& query_slots, const at::Tensor& key_slots,
                       const at::Tensor& query_documents, const at::Tensor& key_documents) {
  at::Tensor allowed = key_slots.view({1, 1, 1, -1}) <= query_slots.view({1, 1, -1, 1});
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
                           double scale, const TokenLayout& layout) {
  const at::Tensor keys = expand_heads(k, q.size(1)), values = expand_heads(v, q.size(1));
  if (!layout.documents.defined() && !layout.slots.defined()) {
    return at::scaled_dot_product_attention(q, keys, values, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, scale);
  }
  const at::Tensor slots = layout.slots.defined() ? layout.slots : at::arange(q.size(2), at::kLong);
  return masked_attention(q, keys, values, scale,
                          {slots, slots, layout.documents, layout.documents});
}

at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale, const MaskDescription& where) {
  if (q.is_cpu()) return MaskedAttention::apply(q, k, v, scale, where);
  return at::scaled_dot_product_attention(q, k, v, where.build(q.device()), 0.0,
                                          /*is_causal=*/false, scale);
}

at::Tensor AttentionInputs::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   double scale) const {
  return backend && *backend ? (*backend)(q, k, v, scale, layout)
                             : local_attention(q, k, v, scale, layout);
}

}  // namespace loom::models
