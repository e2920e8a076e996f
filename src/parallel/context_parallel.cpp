#include "loom/parallel/context_parallel.h"

#include <ATen/ATen.h>

#include "loom/core/check.h"
#include "loom/distributed/comm.h"
#include "loom/parallel/tp_regions.h"

namespace loom::parallel {

at::Tensor context_slots(int64_t seq, int64_t cp, int64_t rank, ContextBalancer balancer) {
  const auto opts = at::TensorOptions().dtype(at::kLong);
  if (balancer == ContextBalancer::kNone) {
    LOOM_CHECK(seq % cp == 0, "sequence of ", seq, " does not split into ", cp, " ranks");
    return at::arange(rank * (seq / cp), (rank + 1) * (seq / cp), opts);
  }
  LOOM_CHECK(seq % (2 * cp) == 0, "sequence of ", seq, " does not split into ", 2 * cp, " chunks");
  const int64_t chunk = seq / (2 * cp);
  const int64_t tail = 2 * cp - 1 - rank;
  return at::cat({at::arange(rank * chunk, (rank + 1) * chunk, opts),
                  at::arange(tail * chunk, (tail + 1) * chunk, opts)});
}

std::vector<int64_t> causal_pairs_per_rank(int64_t seq, int64_t cp, ContextBalancer balancer) {
  std::vector<int64_t> pairs;
  for (int64_t r = 0; r < cp; ++r) {
    pairs.push_back((context_slots(seq, cp, r, balancer) + 1).sum().item<int64_t>());
  }
  return pairs;
}

at::Tensor gather_context(const at::Tensor& x, distributed::Comm& cp) {
  // [b, h, t, d] -> [b, t, h, d]: the sequence on dim 1, as the sequence-parallel gather wants.
  return gather_sequence(x.transpose(1, 2).contiguous(), cp).transpose(1, 2);
}

ContextParallel::ContextParallel(std::shared_ptr<distributed::Comm> cp, ContextBalancer balancer,
                                 std::string method)
    : cp_(std::move(cp)), balancer_(balancer), method_(std::move(method)) {
  LOOM_CHECK_AS(InputError, method_ == "allgather" || method_ == "alltoall",
                "parallelism.context_parallel_rotate_method = \"", method_,
                "\": expected \"allgather\" or \"alltoall\"");
}

int64_t ContextParallel::degree() const {
  return cp_->size();
}

ContextShard ContextParallel::shard(const at::Tensor& inputs, const at::Tensor& labels,
                                    const at::Tensor& documents,
                                    const at::Tensor& positions) const {
  const int64_t seq = inputs.size(1), cp = degree();
  const at::Tensor slots = context_slots(seq, cp, cp_->rank(), balancer_);
  ContextShard out;
  out.inputs = inputs.index_select(1, slots);
  out.labels = labels.index_select(1, slots);
  out.layout.slots = slots;
  // RoPE positions: each token's own, from its document or its slot in the row.
  out.layout.positions = positions.defined()
                             ? positions.index_select(1, slots)
                             : slots.view({1, -1}).expand({inputs.size(0), -1}).contiguous();
  std::vector<at::Tensor> every_rank;
  for (int64_t r = 0; r < cp; ++r) every_rank.push_back(context_slots(seq, cp, r, balancer_));
  out.layout.key_slots = at::cat(every_rank);  // the order gather_context concatenates keys in
  if (documents.defined()) {
    out.layout.documents = documents.index_select(1, slots);
    out.layout.key_documents = documents.index_select(1, out.layout.key_slots);
  }
  return out;
}

models::AttentionBackend ContextParallel::backend() const {
  auto cp = cp_;
  if (method_ == "alltoall") {
    return [cp](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                const models::TokenLayout& layout, const models::LayerAttention& layer) {
      return ring_attention(q, k, v, scale, layout, *cp, layer);
    };
  }
  return [cp](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
              const models::TokenLayout& layout, const models::LayerAttention& layer) {
    LOOM_CHECK(layout.slots.defined() && layout.key_slots.defined(),
               "context-parallel attention without the shard's slots");
    // Gathered with their own heads, expanded to the queries' after.
    const at::Tensor keys = models::expand_heads(gather_context(k, *cp), q.size(1));
    const at::Tensor values = models::expand_heads(gather_context(v, *cp), q.size(1));
    return models::masked_attention(
        q, keys, values, scale,
        {layout.slots, layout.key_slots, layout.documents, layout.key_documents, layer.window},
        layer.sinks);
  };
}

}  // namespace loom::parallel
