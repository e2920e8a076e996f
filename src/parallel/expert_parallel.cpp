#include "loom/parallel/expert_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>

#include "loom/core/check.h"

namespace loom::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor exchange_rows(const at::Tensor& x, distributed::Comm& group,
                         const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  const at::Tensor input = x.contiguous();
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  at::Tensor output = at::empty(shape, input.options());
  group.all_to_all_single(output, input, recv, send);  // splits count rows of dim 0
  return output;
}

// The group rides in the autograd context as an address: Comms are owned by the runtime, which
// outlives every model and graph.
struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, distributed::Comm* group,
                            std::vector<int64_t> send, std::vector<int64_t> recv) {
    ctx->saved_data["comm"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return exchange_rows(x, *group, send, recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* group = reinterpret_cast<distributed::Comm*>(ctx->saved_data["comm"].toInt());
    const auto send = ctx->saved_data["send"].toIntVector();
    const auto recv = ctx->saved_data["recv"].toIntVector();
    return {exchange_rows(grads.at(0), *group, recv, send), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace

at::Tensor all_to_all_rows(const at::Tensor& x, distributed::Comm& group,
                           const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  LOOM_CHECK(static_cast<int>(send.size()) == group.size() &&
                 static_cast<int>(recv.size()) == group.size(),
             "all_to_all_rows: ", send.size(), " send and ", recv.size(),
             " receive splits for a group of ", group.size());
  return AllToAllRows::apply(x, &group, send, recv);
}

AllToAllTokenDispatcher::AllToAllTokenDispatcher(std::shared_ptr<distributed::Comm> ep,
                                                 int64_t num_experts)
    : ep_(std::move(ep)), num_experts_(num_experts) {
  LOOM_CHECK(ep_ && num_experts_ % ep_->size() == 0, "expert parallelism: ", num_experts_,
             " experts do not split over ", ep_ ? ep_->size() : 0, " ranks");
  local_experts_ = num_experts_ / ep_->size();
}

models::TokenDispatcher::Dispatched AllToAllTokenDispatcher::dispatch(const at::Tensor& routed,
                                                                      const at::Tensor& counts) {
  const int64_t peers = ep_->size();
  const int64_t local = local_experts_;
  // 1. Counts: peer j receives this rank's counts for j's experts.
  at::Tensor send_counts = counts.to(at::kLong).contiguous();
  at::Tensor recv_counts = at::empty_like(send_counts);
  ep_->all_to_all_single(recv_counts, send_counts);
  const std::vector<int64_t> sending = to_vector(send_counts);
  const std::vector<int64_t> arriving = to_vector(recv_counts);  // [peer][local expert]
  sent_.assign(static_cast<size_t>(peers), 0);
  received_.assign(static_cast<size_t>(peers), 0);
  for (int64_t j = 0; j < peers; ++j) {
    for (int64_t e = 0; e < local; ++e) {
      sent_[j] += sending[j * local + e];
      received_[j] += arriving[j * local + e];
    }
  }
  // 2. The copies, sorted by global expert, are already grouped by destination peer.
  const at::Tensor arrived = all_to_all_rows(routed, *ep_, sent_, received_);
  // 3. Arrived peer-major (peer, then local expert); the experts want expert-major.
  std::vector<int64_t> start(static_cast<size_t>(peers * local));
  int64_t offset = 0;
  for (int64_t i = 0; i < peers * local; ++i) {
    start[i] = offset;
    offset += arriving[i];
  }
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(offset));
  std::vector<int64_t> local_counts(static_cast<size_t>(local), 0);
  for (int64_t e = 0; e < local; ++e) {
    for (int64_t j = 0; j < peers; ++j) {
      const int64_t i = j * local + e;
      for (int64_t r = 0; r < arriving[i]; ++r) order.push_back(start[i] + r);
      local_counts[e] += arriving[i];
    }
  }
  const auto index_options = at::TensorOptions().dtype(at::kLong);
  const at::Tensor to_expert = at::tensor(order, index_options).to(routed.device());
  to_source_order_ = at::empty_like(to_expert).index_put_(
      {to_expert}, at::arange(static_cast<int64_t>(order.size()), to_expert.options()));
  Dispatched out;
  out.tokens = arrived.index_select(0, to_expert);
  out.local_counts = at::tensor(local_counts, index_options).to(counts.device());
  return out;
}

at::Tensor AllToAllTokenDispatcher::combine(const at::Tensor& expert_out) {
  LOOM_CHECK(to_source_order_.defined(), "combine without a dispatch");
  const at::Tensor by_peer = expert_out.index_select(0, to_source_order_);
  to_source_order_ = at::Tensor();
  return all_to_all_rows(by_peer, *ep_, received_, sent_);
}

void split_experts(models::CausalLM& model, std::map<std::string, Placement>& boxes,
                   const MeshAxis& ep) {
  if (ep.size <= 1) return;
  std::map<std::string, at::Tensor> current;
  for (const auto& item : model.module().named_parameters()) current[item.key()] = item.value();
  for (auto& [name, box] : boxes) {
    if (name.find(".moe.experts.") == std::string::npos) continue;
    LOOM_CHECK(box.lengths[0] % ep.size == 0, "expert parallelism: ", name, " has ", box.lengths[0],
               " experts, which do not split over ", ep.size, " ranks");
    box = box.shard(0, ep);
    model.replace_parameter(name, at::empty(box.lengths, current.at(name).options()));
  }
}

}  // namespace loom::parallel
