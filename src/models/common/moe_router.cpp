// The token-choice router and the grouped matrix product of the shared MoE layer (common/moe.h).
#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>

#include "loom/core/check.h"
#include "loom/core/cuda_support.h"
#include "loom/models/common/moe.h"

namespace loom::models {
namespace {

// Identity whose backward makes the incoming gradient contiguous: at::_grouped_mm's backward
// refuses the expanded gradients some consumers produce (a sum's, for one).
class ContiguousGrad : public torch::autograd::Function<ContiguousGrad> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const at::Tensor& x) {
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grads) {
    return {grads.at(0).contiguous()};
  }
};

at::Tensor looped_matmul(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts) {
  const at::Tensor host = counts.to(at::kCPU, at::kLong);
  const int64_t* n = host.const_data_ptr<int64_t>();
  std::vector<at::Tensor> parts;
  int64_t start = 0;
  for (int64_t g = 0; g < w.size(0); ++g) {
    if (n[g] == 0) continue;
    parts.push_back(x.narrow(0, start, n[g]).matmul(w.select(0, g)));
    start += n[g];
  }
  // No rows: an empty product still connects w to the graph (its gradient is zeros).
  if (parts.empty()) return x.matmul(w.select(0, 0));
  return parts.size() == 1 ? parts.front() : at::cat(parts);
}

}  // namespace

bool grouped_mm_supported(const at::Device& device, at::ScalarType dtype, int64_t k, int64_t m) {
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  const bool aligned = (k * element) % 16 == 0 && (m * element) % 16 == 0;
  if (!aligned) return false;
  if (device.is_cpu()) return dtype == at::kFloat || dtype == at::kBFloat16;
  // CUDA: bf16 on sm90 and later in LibTorch 2.11; older devices take the loop.
  if (device.is_cuda() && dtype == at::kBFloat16) {
    const device::CudaSupport* cuda = device::cuda_support();
    const auto properties =
        cuda ? cuda->properties(device.index() < 0 ? 0 : device.index()) : std::nullopt;
    return properties && properties->major >= 9;
  }
  return false;
}

at::Tensor grouped_matmul(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts,
                          bool grouped) {
  LOOM_CHECK(x.dim() == 2 && w.dim() == 3 && x.size(1) == w.size(1) && counts.numel() == w.size(0),
             "grouped_matmul: x ", x.sizes(), ", w ", w.sizes(), ", counts ", counts.sizes());
  if (!grouped || x.size(0) == 0 ||
      !grouped_mm_supported(x.device(), x.scalar_type(), w.size(1), w.size(2))) {
    return looped_matmul(x, w, counts);
  }
  const at::Tensor offsets = counts.cumsum(0).to(at::kInt);
  // at::_grouped_mm is not on autocast's list: under mixed precision the activations arrive in
  // the compute dtype and the float32 expert weights are cast to it, as autocast casts a matmul's.
  const at::Tensor weights = w.scalar_type() == x.scalar_type() ? w : w.to(x.scalar_type());
  return ContiguousGrad::apply(at::_grouped_mm(x, weights, offsets));
}

at::Tensor sinkhorn(const at::Tensor& logits, int64_t iterations) {
  at::NoGradGuard no_grad;
  // exp of logits shifted by their maximum: a constant factor the row scaling absorbs.
  const at::Tensor cost = (logits.to(at::kFloat) - logits.max()).exp();
  const double rows = static_cast<double>(cost.size(0));
  const double cols = static_cast<double>(cost.size(1));
  constexpr double kEps = 1e-8;
  at::Tensor row_scale = at::ones({cost.size(0)}, cost.options());
  at::Tensor col_scale = at::ones({cost.size(1)}, cost.options());
  for (int64_t i = 0; i < iterations; ++i) {
    row_scale = (1.0 / rows) / ((cost * col_scale.unsqueeze(0)).sum(1) + kEps);
    at::Tensor next = (1.0 / cols) / ((cost * row_scale.unsqueeze(1)).sum(0) + kEps);
    const double change = (next - col_scale).abs().mean().item<double>();
    col_scale = next;
    if (change <= 1e-4) break;
  }
  return cost * row_scale.unsqueeze(1) * col_scale.unsqueeze(0);
}

TokenChoiceRouterImpl::TokenChoiceRouterImpl(int64_t dim, const MoEArgs& moe_args,
                                             const at::TensorOptions& options)
    : args(moe_args) {
  gate = register_module("gate", Linear(dim, args.num_experts, options, args.router_bias));
  gate->convertible = false;  // forward reads its weight in float32, not through Linear
}

at::Tensor TokenChoiceRouterImpl::limit_to_groups(const at::Tensor& choice) const {
  const int64_t tokens = choice.size(0);
  const at::Tensor grouped = choice.view({tokens, args.num_expert_groups, -1});
  // A group's score: its best expert, or its best two (DeepSeek-V3).
  const at::Tensor group_score = args.group_score == GroupScore::kTopTwoSum && grouped.size(2) >= 2
                                     ? std::get<0>(grouped.topk(2, -1)).sum(-1)
                                     : grouped.amax(-1);
  const at::Tensor best_groups = std::get<1>(group_score.topk(args.num_limited_groups, -1));
  const at::Tensor keep = at::zeros_like(group_score, group_score.options().dtype(at::kBool))
                              .scatter_(1, best_groups, true)
                              .unsqueeze(-1)
                              .expand_as(grouped);
  return grouped.masked_fill(keep.logical_not(), -std::numeric_limits<float>::infinity())
      .reshape({tokens, -1});
}

Routing TokenChoiceRouterImpl::forward(const at::Tensor& x, const at::Tensor& expert_bias) {
  // Scores in float32 from float32 inputs and weights, whatever the model's dtype (as
  // transformers' DeepseekV3TopkRouter): near-ties must not flip with the compute dtype. Autocast
  // excluded: it ran the float32 linear in bfloat16 (a sigmoid near 0.5 steps by 0.004 there,
  // and a third of the tokens of a 256-expert router changed experts).
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor logits =
      gate->bias.defined()
          ? at::linear(x.to(at::kFloat), gate->weight.to(at::kFloat), gate->bias.to(at::kFloat))
          : at::linear(x.to(at::kFloat), gate->weight.to(at::kFloat));
  const bool softmax = args.score_function == ScoreFunction::kSoftmax;
  const at::Tensor scores = softmax ? logits.softmax(-1) : logits.sigmoid();
  at::Tensor choice;
  if (args.sinkhorn && is_training()) {
    choice = sinkhorn(logits.detach(), args.sinkhorn_iterations);
  } else {
    choice = scores.detach();
  }
  if (expert_bias.defined()) choice = choice + expert_bias;
  if (args.num_expert_groups > 1) choice = limit_to_groups(choice);
  Routing routing;
  if (force_load_balance) {
    // debug.moe_force_load_balance: copy i of the flattened (token, choice) list goes to expert
    // i mod E, whatever the scores; the gates stay the scores of those experts.
    const int64_t tokens = x.size(0);
    routing.experts = at::arange(tokens * args.top_k, logits.options().dtype(at::kLong))
                          .remainder(args.num_experts)
                          .view({tokens, args.top_k});
  } else {
    routing.experts = std::get<1>(choice.topk(args.top_k, -1, /*largest=*/true, /*sorted=*/true));
  }
  at::Tensor gates = scores.gather(1, routing.experts);
  if (args.route_norm) gates = gates / (gates.sum(-1, /*keepdim=*/true) + 1e-20);
  if (args.route_scale != 1.0) gates = gates * args.route_scale;
  routing.gates = gates;
  routing.probs = softmax ? scores : scores / (scores.sum(-1, /*keepdim=*/true) + 1e-20);
  return routing;
}

}  // namespace loom::models
