// Context parallelism: every sequence of the batch is split over the cp ranks, which hold the
// same rows (the data-parallel index excludes cp) and a share of each row's tokens. Causal
// attention is the one place where tokens meet: the attention backend brings the keys and values
// of the other ranks' tokens (protocols/attention_backend.h); everything else (norms, MLPs,
// the loss over this rank's labels) is per token. Parameters are FSDP-sharded over dp_shard x cp
// and the loss is normalized over dp x cp, so cp ranks split the work of one data-parallel rank.
//
// Load balancing: causal attention makes late tokens cost more. The head-tail order cuts a row
// into 2 cp chunks and gives rank r chunks r and 2cp-1-r, so every rank holds one early and one
// late chunk (torchtitan's and Megatron's rule); `none` gives rank r the r-th contiguous s/cp.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "loom/protocols/attention_backend.h"

namespace loom::distributed {
class Comm;
}

namespace loom::parallel {

enum class ContextBalancer { kHeadTail, kNone };

// The slots of a row of `seq` tokens that cp rank `rank` holds, increasing, [seq / cp] int64.
// Head-tail needs seq % (2 cp) == 0, none seq % cp == 0 (callers check and name the key).
at::Tensor context_slots(int64_t seq, int64_t cp, int64_t rank, ContextBalancer balancer);

// Causal (q, k) pairs of each rank under a split: pairs[r] = sum over its query slots of
// (slot + 1). For tests and docs: head-tail evens them to s (s + 1) / (2 cp) up to one chunk.
std::vector<int64_t> causal_pairs_per_rank(int64_t seq, int64_t cp, ContextBalancer balancer);

// This rank's share of a microbatch and where its tokens sit.
struct ContextShard {
  at::Tensor inputs, labels;  // [b, seq / cp]
  models::TokenLayout layout;
};

class ContextParallel {
 public:
  // `method`: "allgather" (keys and values all-gathered, their gradients reduce-scattered) or
  // "alltoall" (the ring: key/value blocks passed rank to rank, see ring_attention).
  ContextParallel(std::shared_ptr<distributed::Comm> cp, ContextBalancer balancer,
                  std::string method);

  // Splits a microbatch ([b, seq] inputs and labels; documents and positions [b, seq] or
  // undefined) into this rank's tokens with their slots, positions and documents, and the
  // documents of every key slot in the order the backend gathers keys.
  ContextShard shard(const at::Tensor& inputs, const at::Tensor& labels,
                     const at::Tensor& documents, const at::Tensor& positions) const;

  // The attention backend every layer of the model uses under this split.
  models::AttentionBackend backend() const;

  int64_t degree() const;

 private:
  std::shared_ptr<distributed::Comm> cp_;
  ContextBalancer balancer_;
  std::string method_;
};

// Keys and values [b, h, t, d] of the cp ranks' tokens, concatenated in rank order along the
// sequence (dim 2); backward: reduce-scatter of their gradients (each rank's queries contribute
// to every key). Through Comm, so the byte counters see it.
at::Tensor gather_context(const at::Tensor& x, distributed::Comm& cp);

// The ring method: attention of this rank's queries against every rank's keys, the key/value
// blocks passed to the next rank while the current block computes (cp - 1 messages of k and v
// forward; backward cp - 1 again, and cp messages of their gradients travelling home), partial
// results merged by their log-sum-exp. Computes in float32; saves only the local q, k, v, the
// output and the log-sum-exp. `layout` as ContextParallel::shard makes it. The layer's window
// skips the blocks no query can see (they still travel); its sinks join the merge once, after
// the last block, and get their gradient from the final output and log-sum-exp.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          double scale, const models::TokenLayout& layout, distributed::Comm& cp,
                          const models::LayerAttention& layer = {});

}  // namespace loom::parallel
