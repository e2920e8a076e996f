#include "loom/models/common/latent_attention.h"

#include <ATen/ATen.h>

#include <cmath>
#include <tuple>

#include "loom/models/common/rope.h"
#include "loom/protocols/shared_input.h"

namespace loom::models {

LatentAttentionImpl::LatentAttentionImpl(const DecoderArgs& args, const at::TensorOptions& options)
    : mla(*args.mla), n_heads(args.n_heads), rope_layout(args.rope_layout) {
  const int64_t qk = mla.qk_head_dim();
  if (mla.q_lora_rank == 0) {
    wq = register_module("wq", Linear(args.dim, n_heads * qk, options));
  } else {
    wq_a = register_module("wq_a", Linear(args.dim, mla.q_lora_rank, options));
    q_norm = register_module("q_norm", RMSNorm(mla.q_lora_rank, mla.norm_eps, options));
    wq_b = register_module("wq_b", Linear(mla.q_lora_rank, n_heads * qk, options));
  }
  wkv_a =
      register_module("wkv_a", Linear(args.dim, mla.kv_lora_rank + mla.qk_rope_head_dim, options));
  kv_norm = register_module("kv_norm", RMSNorm(mla.kv_lora_rank, mla.norm_eps, options));
  wkv_b = register_module(
      "wkv_b",
      Linear(mla.kv_lora_rank, n_heads * (mla.qk_nope_head_dim + mla.v_head_dim), options));
  wo = register_module("wo", Linear(n_heads * mla.v_head_dim, args.dim, options));
  // YaRN sharpens the softmax by mscale^2 beyond the original context (DeepSeek-V3).
  softmax_scale = 1.0 / std::sqrt(static_cast<double>(qk));
  if (args.yarn_active()) softmax_scale *= args.yarn->softmax_scale_factor();
}

at::Tensor LatentAttentionImpl::queries(const at::Tensor& x) {
  const auto bs = x.size(0), seq = x.size(1);
  // Under tensor parallelism wq / wq_b hold this rank's heads (their rows); wq_a is whole.
  at::Tensor q = wq ? wq->forward(x) : wq_b->forward(q_norm->forward(wq_a->forward(x)));
  return q.view({bs, seq, -1, mla.qk_head_dim()});
}

at::Tensor LatentAttentionImpl::forward(const at::Tensor& x, const AttentionInputs& in) {
  const auto bs = x.size(0), seq = x.size(1);
  const int64_t nope = mla.qk_nope_head_dim, rope = mla.qk_rope_head_dim, v_dim = mla.v_head_dim;
  at::Tensor q, kv;
  {
    const SharedInputScope shared(x);  // wq (or wq_a) and wkv_a read x (float8: one cast)
    q = queries(x);
    kv = wkv_a->forward(x);
  }
  const int64_t heads = q.size(2);
  const at::Tensor latent = kv.narrow(-1, 0, mla.kv_lora_rank);
  at::Tensor q_rot = q.narrow(-1, nope, rope).contiguous();
  at::Tensor k_rot = kv.narrow(-1, mla.kv_lora_rank, rope).unsqueeze(2).contiguous();
  if (in.rotations.defined()) {
    q_rot = apply_rotary_emb_at(q_rot, in.rotations, rope_layout);
    k_rot = apply_rotary_emb_at(k_rot, in.rotations, rope_layout);
  } else {
    std::tie(q_rot, k_rot) = rotate_qk(q_rot, k_rot, in.freqs_cis, rope_layout);
  }
  const at::Tensor expanded = wkv_b->forward(kv_norm->forward(latent)).view({bs, seq, heads, -1});
  const at::Tensor query = at::cat({q.narrow(-1, 0, nope), q_rot}, -1);
  const at::Tensor key =
      at::cat({expanded.narrow(-1, 0, nope), k_rot.expand({bs, seq, heads, rope})}, -1);
  const at::Tensor value = expanded.narrow(-1, nope, v_dim);
  max_logits.observe(is_training(), query.transpose(1, 2), key.transpose(1, 2), softmax_scale, in);
  at::Tensor out =
      in.attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), softmax_scale);
  return wo->forward(out.transpose(1, 2).reshape({bs, seq, heads * v_dim}));
}

at::Tensor LatentAttentionImpl::forward_cached(const at::Tensor& x, const at::Tensor& rotations,
                                               at::Tensor& latents, at::Tensor& rope_keys,
                                               int64_t start, const at::Tensor& mask) {
  const auto bs = x.size(0), seq = x.size(1);
  const int64_t nope = mla.qk_nope_head_dim, rope = mla.qk_rope_head_dim, v_dim = mla.v_head_dim;
  const int64_t rank = mla.kv_lora_rank;
  const at::Tensor q = queries(x);
  const at::Tensor kv = wkv_a->forward(x);
  const at::Tensor q_rot = apply_rotary_emb_at(q.narrow(-1, nope, rope), rotations, rope_layout);
  const at::Tensor k_rot =
      apply_rotary_emb_at(kv.narrow(-1, rank, rope).unsqueeze(2), rotations, rope_layout);
  latents.slice(1, start, start + seq).copy_(kv_norm->forward(kv.narrow(-1, 0, rank)));
  rope_keys.slice(1, start, start + seq).copy_(k_rot.squeeze(2));
  const int64_t used = start + seq;

  // wkv_b [heads * (nope + v), rank] as per-head key [heads, nope, rank] and value [heads, v, rank]
  // maps: q_nope . (W_k latent) = (W_k^T q_nope) . latent, and the value W_v (probs . latent).
  const int64_t heads = q.size(2);  // this rank's (wkv_b holds their rows)
  const at::Tensor w = wkv_b->weight.view({heads, nope + v_dim, rank});
  const at::Tensor absorbed =
      at::einsum("bshn,hnr->bhsr", {q.narrow(-1, 0, nope), w.narrow(1, 0, nope)});
  // q' = [absorbed, q_rot] against k' = [latent, rope key] gives the per-head scores; the value
  // is the latent itself. One key and value for every head: SDPA sees them expanded, not copied.
  const at::Tensor query = at::cat({absorbed, q_rot.transpose(1, 2)}, -1);
  const at::Tensor key = at::cat({latents.slice(1, 0, used), rope_keys.slice(1, 0, used)}, -1)
                             .unsqueeze(1)
                             .expand({bs, heads, used, rank + rope});
  const at::Tensor value = latents.slice(1, 0, used).unsqueeze(1).expand({bs, heads, used, rank});
  const bool causal = !mask.defined() && start == 0 && seq > 1;
  const at::Tensor attended = at::scaled_dot_product_attention(
      query, key, value, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt, 0.0,
      causal, softmax_scale);  // [bs, heads, seq, rank]
  const at::Tensor out = at::einsum("bhsr,hvr->bshv", {attended, w.narrow(1, nope, v_dim)});
  return wo->forward(out.reshape({bs, seq, heads * v_dim}));
}

}  // namespace loom::models
