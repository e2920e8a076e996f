#include "loom/models/common/moe.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "loom/core/check.h"
#include "loom/models/kernels/swiglu.h"
#include "loom/parallel/activation_checkpoint.h"

namespace loom::models {
namespace {

// Identity on the layer's output whose backward also sends `scale` as the gradient of the
// auxiliary loss (Megatron's MoEAuxLossAutoScaler): the loss trains the router without being
// added to the language-model loss the trainer reports.
class AttachAuxLoss : public torch::autograd::Function<AttachAuxLoss> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& output,
                            const at::Tensor& aux, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["aux_options"] = aux.scalar_type();
    return output.view_as(output);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto dtype = ctx->saved_data["aux_options"].toScalarType();
    at::Tensor aux_grad = at::full({}, scale, grads.at(0).options().dtype(dtype));
    return {grads.at(0), aux_grad, at::Tensor()};
  }
};

}  // namespace

GroupedExpertsImpl::GroupedExpertsImpl(const MoEArgs& args, int64_t dim,
                                       const at::TensorOptions& options)
    : use_grouped_mm(args.use_grouped_mm),
      biases(args.expert_biases),
      swiglu_limit(args.swiglu_limit),
      swiglu_alpha(args.swiglu_alpha) {
  const int64_t experts = args.num_experts, hidden = args.hidden_dim;
  register_parameter("w1", at::empty({experts, hidden, dim}, options));
  register_parameter("w2", at::empty({experts, dim, hidden}, options));
  register_parameter("w3", at::empty({experts, hidden, dim}, options));
  if (biases) {
    register_parameter("w1_bias", at::empty({experts, hidden}, options));
    register_parameter("w2_bias", at::empty({experts, dim}, options));
    register_parameter("w3_bias", at::empty({experts, hidden}, options));
  }
}

at::Tensor GroupedExpertsImpl::forward(const at::Tensor& tokens, const at::Tensor& counts) {
  // Read through the table at each call: FSDP swaps the parameters as it gathers.
  // Each routed row gets its expert's bias (rows are sorted by expert, `counts` of each).
  const at::Tensor rows_bias_index =
      biases ? at::repeat_interleave(at::arange(counts.size(0), counts.options()), counts)
             : at::Tensor();
  auto project = [&](const at::Tensor& in, const char* key) {
    const at::Tensor w = param(key).transpose(-2, -1);
    at::Tensor out =
        compute ? compute->forward(in, w, counts) : grouped_matmul(in, w, counts, use_grouped_mm);
    if (biases) {
      at::Tensor b = param(std::string(key) + "_bias");
      if (std::string(key) == "w2" && output_bias_share != 1.0) b = b * output_bias_share;
      out = out + b.index_select(0, rows_bias_index).to(out.scalar_type());
    }
    return out;
  };
  if (swiglu_limit <= 0) {
    return project(kernels::swiglu(project(tokens, "w1"), project(tokens, "w3")), "w2");
  }
  // gpt-oss's clamped SwiGLU (the gate clamped above only, the linear unit both ways, plus one).
  const at::Tensor gate = project(tokens, "w1").clamp_max(swiglu_limit);
  const at::Tensor up = project(tokens, "w3").clamp(-swiglu_limit, swiglu_limit);
  return project((up + 1) * (gate * at::sigmoid(gate * swiglu_alpha)), "w2");
}

MoEImpl::MoEImpl(const DecoderArgs& decoder, const at::TensorOptions& options)
    : args(*decoder.moe) {
  router = register_module("router", TokenChoiceRouter(decoder.dim, args, options));
  experts = register_module("experts", GroupedExperts(args, decoder.dim, options));
  if (args.num_shared_experts > 0) {
    shared_experts = register_module(
        "shared_experts",
        FeedForward(decoder.dim, args.hidden_dim * args.num_shared_experts, options));
  }
  // Float32 whatever the model's dtype: the bias moves by coeff (1e-3) steps.
  const at::TensorOptions state = options.dtype(at::kFloat);
  expert_bias = at::zeros({args.num_experts}, state);
  tokens_per_expert = at::zeros({args.num_experts}, state);
  dropped_ = at::zeros({}, state);
  aux_sum_ = at::zeros({}, state);
}

void MoEImpl::set_dispatcher(std::shared_ptr<TokenDispatcher> dispatcher) {
  dispatcher_ = std::move(dispatcher);
}

at::Tensor MoEImpl::run_experts(const at::Tensor& routed, const at::Tensor& counts) {
  if (!dispatcher_) return experts->forward(routed, counts);
  auto dispatched = dispatcher_->dispatch(routed, counts);
  at::Tensor out = experts->forward(dispatched.tokens, dispatched.local_counts);
  return dispatcher_->combine(out);
}

at::Tensor MoEImpl::aux_loss(const Routing& routing, const at::Tensor& counts, int64_t batch,
                             int64_t seq) const {
  const double e = static_cast<double>(args.num_experts);
  const double k = static_cast<double>(args.top_k);
  if (args.aux_loss_type == AuxLossType::kGlobal) {
    // Switch-transformer balance: E * sum_e (share of routed copies) * (mean probability).
    const double t = static_cast<double>(routing.probs.size(0));
    return (routing.probs.sum(0) * counts.to(at::kFloat)).sum() * (e / (k * t * t));
  }
  // The same per sequence, averaged over the micro-batch's sequences.
  const at::Tensor probs = routing.probs.view({batch, seq, -1});
  const at::Tensor per_sequence =
      at::zeros({batch, args.num_experts}, probs.options())
          .scatter_add_(1, routing.experts.view({batch, -1}),
                        at::ones({batch, seq * args.top_k}, probs.options()));
  const double s = static_cast<double>(seq);
  return ((probs.sum(1) * per_sequence).sum(1) * (e / (k * s * s))).mean();
}

at::Tensor MoEImpl::forward(const at::Tensor& x) {
  const int64_t dim = x.size(-1);
  const at::Tensor tokens = x.reshape({-1, dim});
  const int64_t n = tokens.size(0);
  const int64_t k = args.top_k;
  const bool training = parallel::in_training_forward();
  // The bias (zeros until balancing moves it, or loaded from a checkpoint) shifts the choice.
  Routing routing = router->forward(tokens, expert_bias);

  const at::Tensor flat = routing.experts.reshape({-1});
  at::Tensor counts = at::bincount(flat, {}, args.num_experts);
  if (training) {
    at::NoGradGuard no_grad;
    tokens_per_expert.add_(counts);
  }
  // Routed copies sorted by expert; a stable sort keeps each expert's tokens in token order.
  at::Tensor order = std::get<1>(flat.sort(std::optional<bool>(true), 0));
  at::Tensor gates = routing.gates.reshape({-1}).index_select(0, order);
  if (args.capacity_factor > 0) {
    // Each expert keeps its first `capacity` tokens; the rest pass through the residual only.
    const auto capacity = static_cast<int64_t>(std::ceil(
        args.capacity_factor * static_cast<double>(n * k) / static_cast<double>(args.num_experts)));
    const at::Tensor starts = counts.cumsum(0) - counts;
    const at::Tensor rank =
        at::arange(n * k, flat.options()) - starts.index_select(0, flat.index_select(0, order));
    const at::Tensor kept = (rank < capacity).nonzero().squeeze(1);
    const at::Tensor kept_counts = counts.clamp_max(capacity);
    if (training) dropped_.add_((counts - kept_counts).sum());
    order = order.index_select(0, kept);
    gates = gates.index_select(0, kept);
    counts = kept_counts;
  }
  const at::Tensor routed = tokens.index_select(0, order.div(k, "floor"));
  const at::Tensor out = run_experts(routed, counts) * gates.unsqueeze(1).to(routed.scalar_type());
  // Back to (token, choice) order, then each token's sum over its k choices.
  at::Tensor combined = at::zeros({n * k, dim}, out.options()).index_copy(0, order, out);
  combined = combined.view({n, k, dim}).sum(1);
  if (shared_experts) combined = combined + shared_experts->forward(tokens);

  // Under activation checkpointing the first forward runs without gradients (it counts the
  // loss) and the recompute builds the graph (it attaches it).
  const bool attach = parallel::builds_backward_graph();
  if (args.aux_loss_coeff > 0 && (training || attach)) {
    const int64_t batch = x.dim() == 3 ? x.size(0) : 1;
    const at::Tensor aux =
        aux_loss(routing, at::bincount(flat, {}, args.num_experts), batch, n / batch) *
        args.aux_loss_coeff;
    if (training) {
      aux_sum_.add_(aux.detach());
      ++aux_count_;
    }
    if (attach) combined = AttachAuxLoss::apply(combined, aux, aux_loss_scale_);
  }
  return combined.view(x.sizes());
}

void MoEImpl::init_buffers(const at::Device& device) {
  if (!expert_bias.is_meta() && expert_bias.device() == device) return;
  const at::TensorOptions state = at::TensorOptions().dtype(at::kFloat).device(device);
  expert_bias = at::zeros({args.num_experts}, state);
  tokens_per_expert = at::zeros({args.num_experts}, state);
  dropped_ = at::zeros({}, state);
  aux_sum_ = at::zeros({}, state);
}

MoELoad MoEImpl::take_load_statistics() {
  MoELoad load;
  load.tokens_per_expert = tokens_per_expert.clone();
  load.dropped_tokens = dropped_.clone();
  load.aux_loss = aux_sum_.clone();
  load.aux_loss_count = aux_count_;
  tokens_per_expert.zero_();
  dropped_.zero_();
  aux_sum_.zero_();
  aux_count_ = 0;
  return load;
}

void MoEImpl::update_expert_bias(const at::Tensor& global_tokens_per_expert,
                                 const at::Tensor& skipped) {
  if (args.load_balance_coeff <= 0) return;
  at::NoGradGuard no_grad;
  const at::Tensor load = global_tokens_per_expert.to(expert_bias.device(), at::kFloat);
  // Under-loaded experts (below the mean) become likelier to be picked, over-loaded ones less.
  const at::Tensor change = (load.mean() - load).sign() * args.load_balance_coeff;
  if (skipped.defined()) {  // the same arithmetic, kept only where the step was not skipped
    at::Tensor next = expert_bias + change;
    next.sub_(next.mean());
    expert_bias.copy_(at::where(skipped.to(expert_bias.device()).gt(0.5), expert_bias, next));
    return;
  }
  expert_bias.add_(change);
  expert_bias.sub_(expert_bias.mean());
}

}  // namespace loom::models
