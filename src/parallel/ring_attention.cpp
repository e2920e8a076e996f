// The ring method of context parallelism (context_parallel_rotate_method = "alltoall", Megatron's
// p2p): each rank keeps its queries; the key/value blocks travel rank r -> r+1 around the cp ring,
// so after cp steps every query has met every key. Each step's block partial is merged into the
// running result by the log-sum-exp rule; backward passes the blocks around again, with each
// block's key/value gradient accumulator travelling with it and arriving home after the last step.
// The next block's transfer is posted before the current block computes (Gloo runs it on its own
// threads, NCCL on its stream), so the ring hides the communication behind the attention.
//
// Only this rank's q, k, v, the output and the log-sum-exp are saved for backward: activation
// memory per rank falls as 1/cp, unlike the all-gather, which saves the layer's whole keys/values.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

#include "loom/core/check.h"
#include "loom/distributed/comm.h"
#include "loom/parallel/context_parallel.h"

namespace loom::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Where the queries and every rank's keys sit; blocks are cut from the key side in rank order.
struct RingLayout {
  at::Tensor query_slots, key_slots;          // [n], [cp n] on the CPU (rank order)
  at::Tensor query_documents, key_documents;  // [b, n], [b, cp n] on q's device, or undefined
  int64_t window = 0;                         // the layer's sliding window (0: none)
  int64_t block = 0;                          // n: tokens per rank

  static RingLayout of(AutogradContext* ctx) {
    RingLayout l;
    l.query_slots = ctx->saved_data["query_slots"].toTensor();
    l.key_slots = ctx->saved_data["key_slots"].toTensor();
    l.query_documents = ctx->saved_data["query_documents"].toTensor();
    l.key_documents = ctx->saved_data["key_documents"].toTensor();
    l.window = ctx->saved_data["window"].toInt();
    l.block = l.query_slots.size(0);
    return l;
  }
  void save(AutogradContext* ctx) const {
    ctx->saved_data["query_slots"] = query_slots;
    ctx->saved_data["key_slots"] = key_slots;
    ctx->saved_data["query_documents"] = query_documents;
    ctx->saved_data["key_documents"] = key_documents;
    ctx->saved_data["window"] = window;
  }

  // Which of the queries may see the keys of rank `source`; nullopt when none may: a causal
  // block entirely in the queries' future, or entirely before every query's window (the block
  // still travels on, but costs no compute).
  std::optional<models::MaskDescription> mask(int64_t source) const {
    const at::Tensor slots = key_slots.narrow(0, source * block, block);
    const int64_t first_key = slots.min().item<int64_t>(), last_key = slots.max().item<int64_t>();
    if (first_key > query_slots.max().item<int64_t>()) return std::nullopt;
    if (window > 0 && last_key <= query_slots.min().item<int64_t>() - window) return std::nullopt;
    const at::Tensor documents =
        key_documents.defined() ? key_documents.narrow(1, source * block, block) : at::Tensor();
    return models::MaskDescription{query_slots, slots, query_documents, documents, window};
  }
};

// One in-flight exchange around the ring: `outgoing` to the next rank, the previous rank's
// message of the same shape into `incoming`.
struct RingTransfer {
  at::Tensor incoming;
  std::vector<distributed::Work> works;

  static RingTransfer post(distributed::Comm& cp, const at::Tensor& outgoing) {
    const int next = (cp.rank() + 1) % cp.size(),
              previous = (cp.rank() + cp.size() - 1) % cp.size();
    RingTransfer t;
    t.incoming = at::empty_like(outgoing);
    t.works = cp.batch_send_recv({{distributed::P2POp::Kind::kSend, outgoing, next},
                                  {distributed::P2POp::Kind::kRecv, t.incoming, previous}});
    return t;
  }
  at::Tensor wait() {
    for (auto& w : works) w.wait();
    return incoming;
  }
};

// k and v (or their gradients) travel as one flat message.
at::Tensor pack(const at::Tensor& k, const at::Tensor& v) {
  return at::cat({k.reshape({-1}), v.reshape({-1})});
}
std::pair<at::Tensor, at::Tensor> unpack(const at::Tensor& packed, const at::Tensor& k_like,
                                         const at::Tensor& v_like) {
  return {packed.narrow(0, 0, k_like.numel()).view(k_like.sizes()),
          packed.narrow(0, k_like.numel(), v_like.numel()).view(v_like.sizes())};
}

struct RingAttention : torch::autograd::Function<RingAttention> {
  // q [b, h, n, d], k [b, hk, n, d], v [b, hk, n, dv] (hk divides h; expanded per block after
  // the transfer, so the ring carries hk heads); all float32 here (the caller casts).
  // sinks [h] float or undefined: merged once, after every block (they are one more partial).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const std::optional<at::Tensor>& sinks,
                            double scale, distributed::Comm* cp, const RingLayout& layout) {
    const int64_t ranks = cp->size(), rank = cp->rank();
    at::Tensor out;  // the merged partial: softmax-weighted values of the blocks so far
    at::Tensor lse;  // [b, h, n, 1]: log-sum-exp of the scores so far (-inf: none yet)
    at::Tensor block = pack(k, v);
    for (int64_t step = 0; step < ranks; ++step) {
      RingTransfer transfer;
      if (step + 1 < ranks) transfer = RingTransfer::post(*cp, block);
      const int64_t source = (rank - step + ranks) % ranks;
      if (const auto mask = layout.mask(source)) {
        const auto [kb, vb] = unpack(block, k, v);
        const models::AttentionPartial part =
            models::attention_partial(q, models::expand_heads(kb, q.size(1)),
                                      models::expand_heads(vb, q.size(1)), scale, *mask);
        if (!out.defined()) {
          out = part.out;
          lse = part.lse;
        } else {
          // Log-sum-exp merge: out = out e^(lse - new) + part e^(part_lse - new).
          const at::Tensor merged = at::logaddexp(lse, part.lse);
          const at::Tensor finite = merged.masked_fill(merged.isinf(), 0.0);
          out = out * (lse - finite).exp() + part.out * (part.lse - finite).exp();
          lse = merged;
        }
      }
      if (step + 1 < ranks) block = transfer.wait();
    }
    // Every query sees at least its own key (step 0), so lse is finite and out is complete.
    if (sinks) {
      models::AttentionPartial merged{out, lse};
      models::merge_sinks(merged, *sinks);
      out = merged.out;
      lse = merged.lse;
    }
    ctx->save_for_backward({q, k, v, out, lse, sinks.value_or(at::Tensor())});
    ctx->saved_data["comm"] = reinterpret_cast<int64_t>(cp);
    layout.save(ctx);
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    auto& cp = *reinterpret_cast<distributed::Comm*>(ctx->saved_data["comm"].toInt());
    const RingLayout layout = RingLayout::of(ctx);
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::Tensor dout = grads[0].contiguous();
    const int64_t ranks = cp.size(), rank = cp.rank();
    at::Tensor dq = at::zeros_like(q);
    at::Tensor block = pack(k, v);
    RingTransfer grads_in;
    for (int64_t step = 0; step < ranks; ++step) {
      RingTransfer blocks_in;
      if (step + 1 < ranks) blocks_in = RingTransfer::post(cp, block);
      const int64_t source = (rank - step + ranks) % ranks;
      const auto [kb, vb] = unpack(block, k, v);
      at::Tensor dk = at::zeros_like(k), dv = at::zeros_like(v);
      if (const auto mask = layout.mask(source)) {
        auto [dq_part, dk_part, dv_part] = models::attention_partial_backward(
            dout, q, models::expand_heads(kb, q.size(1)), models::expand_heads(vb, q.size(1)), out,
            lse, scale, *mask);
        dq.add_(dq_part);
        dk = models::fold_heads(dk_part, k.size(1));
        dv = models::fold_heads(dv_part, v.size(1));
      }
      // This block's k/v gradient, plus what the ranks before us accumulated into it.
      at::Tensor accumulated = pack(dk, dv);
      if (step > 0) accumulated.add_(grads_in.wait());
      grads_in = RingTransfer::post(cp, accumulated);  // on to the next rank; the last one home
      if (step + 1 < ranks) block = blocks_in.wait();
    }
    const auto [dk, dv] = unpack(grads_in.wait(), k, v);
    at::Tensor dsinks;
    if (saved[5].defined()) dsinks = models::sinks_backward(dout, out, lse, saved[5]);
    return {dq, dk, dv, dsinks, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          double scale, const models::TokenLayout& layout, distributed::Comm& cp,
                          const models::LayerAttention& layer) {
  LOOM_CHECK(layout.slots.defined() && layout.key_slots.defined(),
             "context-parallel attention without the shard's slots");
  LOOM_CHECK(k.size(2) == q.size(2) && layout.key_slots.size(0) == cp.size() * q.size(2),
             "ring attention: ", q.size(2), " queries and ", k.size(2), " keys per rank over ",
             cp.size(), " ranks, but ", layout.key_slots.size(0), " key slots");
  RingLayout ring;
  ring.query_slots = layout.slots.cpu();
  ring.key_slots = layout.key_slots.cpu();
  ring.block = q.size(2);
  ring.window = layer.window;
  if (layout.documents.defined()) {
    ring.query_documents = layout.documents.to(q.device());
    ring.key_documents = layout.key_documents.to(q.device());
  }
  const auto dtype = q.scalar_type();
  LOOM_CHECK(!layer.sinks.defined() || layer.sinks.numel() == q.size(1),
             "attention sinks: ", layer.sinks.numel(), " for ", q.size(1), " query heads");
  // Autograd functions take an absent tensor as nullopt, not as an undefined tensor.
  const auto sinks =
      layer.sinks.defined() ? std::optional<at::Tensor>(layer.sinks.to(at::kFloat)) : std::nullopt;
  const at::Tensor out =
      RingAttention::apply(q.to(at::kFloat), k.to(at::kFloat).contiguous(),
                           v.to(at::kFloat).contiguous(), sinks, scale, &cp, ring);
  return out.to(dtype);
}

}  // namespace loom::parallel
