#include "loom/models/common/moe_parallelize.h"

#include <ATen/ATen.h>

#include <limits>

#include "loom/core/check.h"
#include "loom/distributed/runtime.h"
#include "loom/models/common/decoder_model.h"
#include "loom/parallel/expert_parallel.h"

namespace loom::models {
namespace {

using distributed::MeshGroup;
using parallel::Placement;

// The mixture-of-experts layers of `parts`, in layer order, with their blocks' names.
std::vector<std::pair<std::string, MoE>> named_moe_layers(
    const std::vector<std::unique_ptr<CausalLM>>& parts) {
  std::vector<std::pair<std::string, MoE>> layers;
  for (const auto& part : parts) {
    auto* decoder = dynamic_cast<DecoderModel*>(part.get());
    if (decoder == nullptr) continue;
    for (auto& block : decoder->transformer()->blocks) {
      if (block->moe) layers.emplace_back("layers." + std::to_string(block->layer_id), block->moe);
    }
  }
  return layers;
}

std::vector<MoE> moe_layers(const std::vector<std::unique_ptr<CausalLM>>& parts) {
  std::vector<MoE> layers;
  for (auto& [name, layer] : named_moe_layers(parts)) layers.push_back(layer);
  return layers;
}

// Each layer's balancing bias, for checkpoints: the same on every rank that holds the layer (one
// pipeline stage's data-, expert- and tensor-parallel ranks).
void add_balancing_state(parallel::ParallelModel& out,
                         const std::vector<std::unique_ptr<CausalLM>>& parts,
                         const parallel::ParallelContext& context) {
  for (auto& [name, layer] : named_moe_layers(parts)) {
    Placement placement = Placement::whole(layer->expert_bias.sizes());
    for (MeshGroup group : {MeshGroup::dp_replicate, MeshGroup::fsdp, MeshGroup::tp}) {
      auto comm = context.runtime.group_ptr(group);
      if (comm->size() > 1) {
        placement = placement.replicate(parallel::MeshAxis::of(comm), /*partial=*/false);
      }
    }
    out.buffers.push_back({name + ".moe.expert_bias", layer->expert_bias, std::move(placement)});
  }
}

// The per-layer load of the step, summed over `token_group`, as rows
// [tokens per expert (E), dropped, aux loss sum, aux loss count].
at::Tensor global_load(std::vector<std::pair<std::string, MoE>>& layers,
                       distributed::Comm& token_group) {
  std::vector<at::Tensor> rows;
  for (auto& [name, layer] : layers) {
    MoELoad load = layer->take_load_statistics();
    const auto options = load.tokens_per_expert.options();
    rows.push_back(
        at::cat({load.tokens_per_expert, load.dropped_tokens.view({1}), load.aux_loss.view({1}),
                 at::full({1}, static_cast<double>(load.aux_loss_count), options)}));
  }
  at::Tensor global = at::stack(rows);
  if (token_group.size() > 1) token_group.all_reduce(global);
  return global;
}

int64_t layer_index(const std::string& block) {  // "layers.7" -> 7
  return std::stoll(block.substr(block.rfind('.') + 1));
}

// The metrics of a logged step: per layer the max/mean expert load ("moe/load_max_mean/layers.N")
// and over all layers its maximum, the dropped copies, the mean auxiliary loss (x its
// coefficient) and the range of the balancing biases. Pipeline stages hold different layers:
// each fills its rows, the pp group takes the maximum (-inf where a stage has no layer; a stage
// with none at all joins with every row -inf). `global`: global_load's, unused without layers.
parallel::ModelMetrics load_metrics(std::vector<std::pair<std::string, MoE>>& layers,
                                    const at::Tensor& global, distributed::Comm& pp,
                                    int64_t num_layers, const at::Device& device) {
  enum Column { kLoad, kNegBiasMin, kBiasMax, kDropped, kAux, kColumns };
  const double none = -std::numeric_limits<double>::infinity();
  at::Tensor stats = at::full({num_layers, kColumns}, none, at::kDouble);
  const at::Tensor host = layers.empty() ? at::Tensor() : global.to(at::kCPU, at::kDouble);
  for (size_t i = 0; i < layers.size(); ++i) {
    const int64_t experts = layers[i].second->args.num_experts;
    const at::Tensor row = host[static_cast<int64_t>(i)];
    const at::Tensor tokens = row.narrow(0, 0, experts);
    const double mean = tokens.mean().item<double>();
    const at::Tensor bias = layers[i].second->expert_bias.to(at::kCPU, at::kDouble);
    const double count = row[experts + 2].item<double>();
    at::Tensor out = stats[layer_index(layers[i].first)];
    out[kLoad] = mean > 0 ? tokens.max().item<double>() / mean : 0.0;
    out[kNegBiasMin] = -bias.min().item<double>();
    out[kBiasMax] = bias.max().item<double>();
    out[kDropped] = row[experts].item<double>();
    out[kAux] = count > 0 ? row[experts + 1].item<double>() / count : none;
  }
  if (pp.size() > 1) {
    at::Tensor shared = stats.to(device);
    pp.all_reduce(shared, distributed::ReduceOp::kMax);
    stats = shared.to(at::kCPU);
  }
  parallel::ModelMetrics metrics;
  double load = 0, bias_min = -none, bias_max = none, dropped = 0, aux = 0;
  int64_t aux_layers = 0;
  for (int64_t l = 0; l < num_layers; ++l) {
    const auto value = [&](Column c) { return stats[l][c].item<double>(); };
    if (value(kLoad) == none) continue;  // a dense layer
    metrics.emplace_back("moe/load_max_mean/layers." + std::to_string(l), value(kLoad));
    load = std::max(load, value(kLoad));
    bias_min = std::min(bias_min, -value(kNegBiasMin));
    bias_max = std::max(bias_max, value(kBiasMax));
    dropped += value(kDropped);
    if (value(kAux) != none) {
      aux += value(kAux);
      ++aux_layers;
    }
  }
  if (metrics.empty()) return metrics;
  metrics.emplace_back("moe/load_max_mean", load);
  metrics.emplace_back("moe/dropped_tokens", dropped);
  metrics.emplace_back("moe/bias_min", bias_min);
  metrics.emplace_back("moe/bias_max", bias_max);
  if (aux_layers > 0) metrics.emplace_back("moe/aux_loss", aux / static_cast<double>(aux_layers));
  return metrics;
}

// After each optimizer step: DeepSeek-V3's balancing from the step's token counts of every
// layer, summed over the ranks that route different tokens through the same layers (dp x cp; a
// pipeline stage's own layers), so every rank moves the bias alike; on logged steps, the load
// metrics. `layers` may be empty: a pipeline stage without a mixture layer still joins the
// stages' metrics on logged steps.
std::function<parallel::ModelMetrics(const parallel::AfterStep&)> moe_after_step(
    std::vector<std::pair<std::string, MoE>> layers, const parallel::ParallelContext& context,
    int64_t num_layers) {
  bool balance = false;
  for (auto& [name, layer] : layers) balance = balance || layer->args.load_balance_coeff > 0;
  auto tokens = context.runtime.group_ptr(MeshGroup::loss);
  auto pp = context.runtime.group_ptr(MeshGroup::pp);
  return [layers = std::move(layers), tokens, pp, balance, num_layers,
          device = context.device](const parallel::AfterStep& step) mutable {
    const bool log_step = step.log_step;
    if (layers.empty()) {
      return log_step ? load_metrics(layers, at::Tensor(), *pp, num_layers, device)
                      : parallel::ModelMetrics{};
    }
    if (!balance && !log_step) {
      for (auto& [name, layer] : layers) layer->take_load_statistics();  // a fresh window
      return parallel::ModelMetrics{};
    }
    const at::Tensor global = global_load(layers, *tokens);
    for (size_t i = 0; i < layers.size(); ++i) {
      auto& layer = layers[i].second;
      layer->update_expert_bias(
          global[static_cast<int64_t>(i)].narrow(0, 0, layer->args.num_experts), step.skipped);
    }
    return log_step ? load_metrics(layers, global, *pp, num_layers, device)
                    : parallel::ModelMetrics{};
  };
}

// The auxiliary loss is a mean over the step's forwards and the data-parallel ranks, as the
// language-model loss is: each forward's gradient is scaled by 1 / (forwards x dp x cp).
void scale_aux_losses(std::vector<MoE> layers, const parallel::ParallelContext& context) {
  const auto& t = context.config.training;
  const auto& dims = context.runtime.dims();
  const int64_t global =
      t.global_batch_size > 0 ? t.global_batch_size : t.local_batch_size * dims.dp_degree();
  const int64_t rows_per_forward =
      dims.pp > 1 ? context.config.parallelism.pipeline_parallel_microbatch_size
                  : t.local_batch_size;
  const int64_t forwards =
      std::max<int64_t>(1, global / dims.dp_degree() / std::max<int64_t>(1, rows_per_forward));
  // Tensor-parallel ranks route the same tokens: each adds the same auxiliary gradient to the
  // router's partial sums, which TP then adds up.
  for (auto& layer : layers) {
    layer->set_aux_loss_scale(1.0 / static_cast<double>(forwards * dims.dp_cp_degree() * dims.tp));
  }
}

}  // namespace

void parallelize_moe_layers(parallel::ParallelModel& out,
                            const std::vector<std::unique_ptr<CausalLM>>& parts,
                            const parallel::ParallelContext& context) {
  const auto layers = moe_layers(parts);
  const auto& model = context.config.model;
  // Multi-token-prediction blocks count as layers after the model's (their mixtures route too).
  const DecoderArgs& args = decoder_args(*parts.front());
  const int64_t total_layers = args.n_layers + args.num_mtp_layers;
  if (layers.empty()) {
    // A stage of a mixture model without a mixture layer (DeepSeek-V3's dense first layers, the
    // embedding alone) joins the other stages' max of the load metrics on logged steps;
    // without it, their all-reduce would pair with its next collective.
    if (args.moe && context.runtime.dims().pp > 1) {
      out.after_optimizer_step = moe_after_step({}, context, total_layers);
    }
    return;
  }
  for (auto layer : layers) {
    layer->router->force_load_balance = context.config.debug.moe_force_load_balance;
    if (model.moe_load_balance_coeff) {
      layer->args.load_balance_coeff = *model.moe_load_balance_coeff;
      layer->router->args.load_balance_coeff = *model.moe_load_balance_coeff;
    }
    if (model.moe_aux_loss_coeff) layer->args.aux_loss_coeff = *model.moe_aux_loss_coeff;
  }
  if (context.runtime.dims().ep_enabled()) {
    const auto ep = context.runtime.group_ptr(MeshGroup::ep);
    for (auto layer : layers) {
      layer->set_dispatcher(
          std::make_shared<parallel::AllToAllTokenDispatcher>(ep, layer->args.num_experts));
    }
  }
  add_balancing_state(out, parts, context);
  scale_aux_losses(layers, context);
  out.after_optimizer_step = moe_after_step(named_moe_layers(parts), context, total_layers);
}

}  // namespace loom::models
