// Expert parallelism: the routed experts of every MoE layer are split over the ep group (a part
// of dp_shard, distributed/device_mesh.h), each rank holding E / ep consecutive experts, and the
// routed token copies travel to the rank of their expert and back:
//  1. an all-to-all of the token counts per expert (equal splits: E / ep counts to each peer);
//  2. the dispatch all-to-all of the copies (uneven splits: what each peer's experts receive);
//  3. the local experts run on the received copies regrouped by local expert;
//  4. the combine all-to-all sends the outputs back, in the order they came.
// Both all-to-alls are autograd functions whose backward is the mirrored all-to-all, so an
// expert's gradient is the sum over every token that reached it, from any rank, exactly once.
// FSDP then shards each rank's block of experts over efsdp (the ranks holding the same experts).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/distributed/comm.h"
#include "loom/protocols/causal_lm.h"
#include "loom/protocols/token_dispatcher.h"
#include "loom/parallel/placement.h"

namespace loom::parallel {

class AllToAllTokenDispatcher final : public models::TokenDispatcher {
 public:
  AllToAllTokenDispatcher(std::shared_ptr<distributed::Comm> ep, int64_t num_experts);
  Dispatched dispatch(const at::Tensor& routed, const at::Tensor& counts) override;
  at::Tensor combine(const at::Tensor& expert_out) override;

 private:
  std::shared_ptr<distributed::Comm> ep_;
  int64_t num_experts_;
  int64_t local_experts_;
  // Between a dispatch and its combine (one MoE forward at a time).
  std::vector<int64_t> sent_, received_;  // copies per peer, this rank's view
  at::Tensor to_source_order_;            // expert-major rows -> the order they arrived in
};

// The differentiable all-to-all of rows: rank r sends rows [sum(send[:j]), +send[j]) of `x` to
// peer j and receives recv[j] rows from it; backward sends the gradients back the same way.
at::Tensor all_to_all_rows(const at::Tensor& x, distributed::Comm& group,
                           const std::vector<int64_t>& send, const std::vector<int64_t>& recv);

// Splits the boxes of the routed experts' parameters (names containing ".moe.experts.") along
// dim 0 (the expert) over `ep`, piece ep.rank of ep.size, and gives the model's (meta)
// parameters the boxes' shapes. The other boxes are unchanged.
void split_experts(models::CausalLM& model, std::map<std::string, Placement>& boxes,
                   const MeshAxis& ep);

}  // namespace loom::parallel
