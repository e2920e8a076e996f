#include "loom/models/llama/parallelize.h"

#include <ATen/ATen.h>

#include <map>

#include "loom/core/check.h"
#include "loom/distributed/runtime.h"
#include "loom/models/llama/args.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/loss_parallel.h"
#include "loom/parallel/tensor_parallel.h"
#include "loom/train/loss.h"

namespace loom::models::llama {
namespace {

using distributed::MeshGroup;
using parallel::ModelParameter;
using parallel::ParallelModel;
using parallel::Placement;

// Named after the mesh dimension even where the tp group is the whole world.
parallel::MeshAxis tp_axis(const parallel::ParallelContext& context) {
  auto tp = parallel::MeshAxis::of(context.runtime.group_ptr(MeshGroup::tp));
  tp.name = "tp";
  return tp;
}

bool uses_fsdp(const parallel::ParallelContext& context) {
  const auto& dims = context.runtime.dims();
  return dims.dp_shard * dims.cp > 1 || context.config.debug.force_fsdp;
}

// Every parameter's box before the data-parallel wrappers: whole until TP splits some.
std::map<std::string, Placement> initial_placements(CausalLM& model) {
  std::map<std::string, Placement> placements;
  for (const auto& item : model.module().named_parameters()) {
    placements.emplace(item.key(), Placement::whole(item.value().sizes()));
  }
  return placements;
}

// 1. Tensor parallelism: the plan splits the boxes and hooks the region changes in.
std::map<std::string, Placement> apply_tp(CausalLM& model, const parallel::ParallelContext& context) {
  auto boxes = initial_placements(model);
  const auto& dims = context.runtime.dims();
  if (!dims.tp_enabled()) return boxes;
  return parallel::apply_tensor_parallel(model, tensor_parallel_plan(dims.loss_parallel_enabled()),
                                         tp_axis(context), std::move(boxes));
}

// The loss over the head's output: vocab-parallel over the output's columns under TP unless
// parallelism.disable_loss_parallel.
parallel::LossFunction make_loss(const std::map<std::string, Placement>* head_boxes,
                                 const parallel::ParallelContext& context) {
  const auto& dims = context.runtime.dims();
  if (head_boxes && dims.tp_enabled() && dims.loss_parallel_enabled()) {
    const int64_t first = head_boxes->at("output.weight").offsets[0];
    return [comm = tp_axis(context).comm, first](const at::Tensor& logits,
                                                  const at::Tensor& labels) {
      return parallel::vocab_parallel_cross_entropy_sum(logits, labels, first, *comm);
    };
  }
  return [](const at::Tensor& logits, const at::Tensor& labels) {
    return train::cross_entropy_sum(logits, labels);
  };
}

// FSDP (HSDP with dp_replicate > 1): the shards become the optimizer's parameters, the
// unsharded parameters compute in mixed_precision_param (so no autocast on top).
parallel::GradientSync* apply_fsdp(ParallelModel& out, CausalLM& model,
                                   const std::map<std::string, Placement>& boxes,
                                   const parallel::ParallelContext& context) {
  const at::ScalarType compute = context.autocast_dtype.value_or(context.param_dtype);
  auto fsdp = std::make_unique<parallel::FullyShardedDataParallel>(
      model, fsdp_units(model), boxes, context.runtime.group_ptr(MeshGroup::fsdp),
      context.runtime.group_ptr(MeshGroup::dp_replicate), context.device, context.seed,
      parallel::fsdp_options(context.config, compute));
  const auto& names = fsdp->parameter_names();
  for (size_t i = 0; i < names.size(); ++i) {
    out.parameters.push_back({names[i], fsdp->sharded_parameters()[i], fsdp->placement(names[i])});
  }
  out.autocast = std::nullopt;
  out.wrappers.push_back(std::move(fsdp));
  return out.wrappers.back().get();
}

// Without FSDP: every local box is drawn in training.dtype on the device; DDP all-reduces the
// gradients of replicas.
parallel::GradientSync* materialize_and_replicate(ParallelModel& out, CausalLM& model,
                                                  const std::map<std::string, Placement>& boxes,
                                                  const parallel::ParallelContext& context) {
  const auto options = at::TensorOptions().dtype(context.param_dtype).device(context.device);
  auto replicas = context.runtime.group_ptr(MeshGroup::dp_replicate);
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& [name, box] : boxes) {
    at::Tensor local = parallel::materialize_local(model, name, box, options, context.seed);
    local.set_requires_grad(true);
    model.replace_parameter(name, local);
  }
  model.init_buffers(context.device);
  // Registration order (DDP buckets in reverse of it, roughly backward's order).
  for (const auto& item : model.module().named_parameters()) {
    Placement placement = boxes.at(item.key());
    if (replicas->size() > 1) {
      placement = placement.replicate(parallel::MeshAxis::of(replicas), /*partial=*/true);
    }
    out.parameters.push_back({item.key(), item.value(), std::move(placement)});
    named.emplace_back(item.key(), item.value());
  }
  out.autocast = context.autocast_dtype;
  if (replicas->size() <= 1) return nullptr;
  out.wrappers.push_back(std::make_unique<parallel::DataParallel>(std::move(named), replicas));
  return out.wrappers.back().get();
}

}  // namespace

std::vector<parallel::TpRule> tensor_parallel_plan(bool loss_parallel) {
  using namespace parallel;
  // The head gathers the sequence and keeps its vocabulary columns for the vocab-parallel loss,
  // or gathers them too.
  TpRule output = colwise("output");
  output.input = InputLayout::kGatherSequence;
  output.output = loss_parallel ? OutputLayout::kAsIs : OutputLayout::kGatherVocab;
  return {
      vocab_parallel_embedding("tok_embeddings"),
      sequence_parallel("layers.*.attention_norm"),
      sequence_region("layers.*.attention"),
      colwise("layers.*.attention.wq"),
      colwise("layers.*.attention.wk"),
      colwise("layers.*.attention.wv"),
      rowwise("layers.*.attention.wo"),
      sequence_parallel("layers.*.ffn_norm"),
      sequence_region("layers.*.feed_forward"),
      colwise("layers.*.feed_forward.w1"),
      rowwise("layers.*.feed_forward.w2"),
      colwise("layers.*.feed_forward.w3"),
      sequence_parallel("norm"),
      output,
  };
}

void check_llama_parallelism(const config::JobConfig& config) {
  const int64_t tp = config.parallelism.tensor_parallel_degree;
  if (tp <= 1) return;
  const auto& flavors = llama3_flavors();
  auto it = flavors.find(config.model.flavor);
  if (it == flavors.end()) return;  // reported by the model lookup, naming the flavors
  const LlamaArgs& args = it->second;
  LOOM_CHECK_AS(InputError, args.n_heads % tp == 0 && args.kv_heads() % tp == 0,
                "parallelism.tensor_parallel_degree = ", tp, " must divide the attention heads "
                "of model.flavor '", config.model.flavor, "' (n_heads ", args.n_heads,
                ", n_kv_heads ", args.kv_heads(), "): tensor parallelism splits whole heads");
}

std::vector<parallel::FsdpUnit> fsdp_units(CausalLM& model) {
  std::map<std::string, std::vector<std::string>> params_of;
  for (const auto& item : model.module().named_parameters()) {
    const std::string& name = item.key();
    std::string module = name.substr(0, name.rfind('.'));  // "layers.3.attention.wq"
    if (module.rfind("layers.", 0) == 0) {
      module = module.substr(0, module.find('.', std::string("layers.").size()));  // "layers.3"
    }
    params_of[module].push_back(name);
  }
  std::vector<parallel::FsdpUnit> units;
  for (const std::string& module : model.hookable_modules()) {
    auto params = params_of[module];
    // The final norm and the output projection run back to back: one unit.
    if (module == "output" && !units.empty() && units.back().name == "norm") {
      units.back().name = "norm+output";
      units.back().modules.push_back(module);
      for (auto& p : params) units.back().parameters.push_back(std::move(p));
      continue;
    }
    units.push_back({module, {module}, std::move(params)});
  }
  return units;
}

parallel::ParallelModel parallelize_llama(std::vector<std::unique_ptr<CausalLM>> parts,
                                          const parallel::ParallelContext& context) {
  const auto& dims = context.runtime.dims();
  LOOM_CHECK_AS(InputError, dims.cp == 1, "parallelism.context_parallel_degree = ", dims.cp,
                ": context parallelism is not implemented yet");
  LOOM_CHECK(!parts.empty(), "parallelize_llama needs at least one model part");
  ParallelModel out;
  const std::map<std::string, Placement>* head_boxes = nullptr;
  std::vector<std::map<std::string, Placement>> boxes;
  boxes.reserve(parts.size());
  for (auto& part : parts) {
    LOOM_CHECK(part->module().parameters().empty() || part->module().parameters().front().is_meta(),
               "parallelize_llama expects model parts built on the meta device");
    // 1. Tensor and sequence parallelism: boxes and region hooks.
    boxes.push_back(apply_tp(*part, context));
    if (part->part().head) head_boxes = &boxes.back();
    // 2. Activation checkpointing, inside the data-parallel wrappers' unit hooks.
    part->apply_activation_checkpointing(context.config.activation_checkpoint);
  }
  out.loss = make_loss(head_boxes, context);
  // 3. FSDP/HSDP or DDP per part (a pipeline stage reduces its gradients on its own last
  // backward), which also materialize the local parameters.
  for (size_t i = 0; i < parts.size(); ++i) {
    out.part_syncs.push_back(uses_fsdp(context)
                                 ? apply_fsdp(out, *parts[i], boxes[i], context)
                                 : materialize_and_replicate(out, *parts[i], boxes[i], context));
  }
  // 4. TP's all-reduce of the norms' gradients, after the data-parallel reductions.
  if (dims.tp_enabled()) {
    out.wrappers.push_back(std::make_unique<parallel::TensorParallelGradientSync>(
        out.parameters, context.runtime.group_ptr(MeshGroup::tp)));
  }
  auto chain = std::make_unique<parallel::GradientSyncChain>();
  for (const auto& wrapper : out.wrappers) chain->add(wrapper.get());
  out.description = chain->describe();
  out.gradient_sync = std::move(chain);
  // Between pipeline stages: the hidden state, sequence-sharded under TP (sequence parallel),
  // in the dtype the blocks compute their residual stream in.
  const int64_t dim = llama3_flavors().at(context.config.model.flavor).dim;
  const int64_t tp = dims.tp;
  out.boundary_shape = [dim, tp](int64_t rows, int64_t seq) {
    return std::vector<int64_t>{rows, seq / tp, dim};
  };
  out.boundary_dtype = uses_fsdp(context) ? context.autocast_dtype.value_or(context.param_dtype)
                                          : context.param_dtype;
  for (auto& part : parts) out.parts.push_back(std::move(part));
  return out;
}

}  // namespace loom::models::llama
