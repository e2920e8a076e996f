#include "loom/models/common/decoder_parallelize.h"

#include <ATen/ATen.h>

#include <map>

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/distributed/runtime.h"
#include "loom/models/common/decoder_model.h"
#include "loom/models/common/layers.h"
#include "loom/models/common/moe_parallelize.h"
#include "loom/models/common/qk_clip.h"
#include "loom/models/loss.h"
#include "loom/models/mtp.h"
#include "loom/parallel/context_parallel.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/expert_parallel.h"
#include "loom/parallel/loss_parallel.h"
#include "loom/parallel/tensor_parallel.h"
#include "loom/parallel/tied_parameters.h"

namespace loom::models {
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

parallel::MeshAxis expert_axis(const parallel::ParallelContext& context) {
  auto ep = parallel::MeshAxis::of(context.runtime.group_ptr(MeshGroup::ep));
  ep.name = "ep";
  return ep;
}

bool uses_fsdp(const parallel::ParallelContext& context) {
  return parallel::uses_fsdp(context.runtime.dims(), context.config);
}

// This part's multi-token-prediction blocks (the head's part holds them).
int64_t mtp_blocks_of(const CausalLM& part) {
  const auto* decoder = dynamic_cast<const DecoderModel*>(&part);
  return decoder == nullptr ? 0 : const_cast<DecoderModel*>(decoder)->transformer()->mtp_blocks;
}

// The weight the head projects with: its own, or the tied embedding table.
std::string head_weight(const CausalLM& part) {
  return decoder_args(part).tie_embeddings ? "tok_embeddings.weight" : "output.weight";
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
std::map<std::string, Placement> apply_tp(CausalLM& model,
                                          const parallel::ParallelContext& context) {
  auto boxes = initial_placements(model);
  const auto& dims = context.runtime.dims();
  if (!dims.tp_enabled()) return boxes;
  boxes = parallel::apply_tensor_parallel(
      model, decoder_tensor_parallel_plan(model, dims.loss_parallel_enabled()), tp_axis(context),
      std::move(boxes));
  // Row-parallel outputs are partial sums the tp ranks add up: each adds 1 / tp of the bias.
  const double share = 1.0 / static_cast<double>(dims.tp);
  for (auto& block : dynamic_cast<DecoderModel&>(model).transformer()->blocks) {
    if (block->attention && block->attention->wo->bias.defined()) {
      block->attention->wo->bias_share = share;
    }
    if (block->moe && block->moe->experts->biases) block->moe->experts->output_bias_share = share;
  }
  return boxes;
}

// The loss over the head's output: vocab-parallel over the output's columns under TP unless
// parallelism.disable_loss_parallel.
parallel::LossFunction make_loss(const std::map<std::string, Placement>* head_boxes,
                                 const std::string& head_weight_name,
                                 const parallel::ParallelContext& context) {
  const auto& dims = context.runtime.dims();
  if (head_boxes && dims.tp_enabled() && dims.loss_parallel_enabled()) {
    const int64_t first = head_boxes->at(head_weight_name).offsets[0];
    return
        [comm = tp_axis(context).comm, first](const at::Tensor& logits, const at::Tensor& labels) {
          return parallel::vocab_parallel_cross_entropy_sum(logits, labels, first, *comm);
        };
  }
  return [](const at::Tensor& logits, const at::Tensor& labels) {
    return cross_entropy_sum(logits, labels);
  };
}

// FSDP (HSDP with dp_replicate > 1): the shards become the optimizer's parameters, the
// unsharded parameters compute in mixed_precision_param (so no autocast on top).
parallel::GradientSync* apply_fsdp(ParallelModel& out, CausalLM& model,
                                   const std::map<std::string, Placement>& boxes,
                                   const parallel::ParallelContext& context) {
  const at::ScalarType compute = context.autocast_dtype.value_or(context.param_dtype);
  parallel::FsdpOptions options = parallel::fsdp_options(context.config, compute);
  options.gather_codecs = linear_gather_codecs(model.module());  // float8 all-gather
  auto fsdp = std::make_unique<parallel::FullyShardedDataParallel>(
      model, decoder_fsdp_units(model, context.runtime.group_ptr(MeshGroup::efsdp)), boxes,
      context.runtime.group_ptr(MeshGroup::fsdp),
      context.runtime.group_ptr(MeshGroup::dp_replicate), context.device, context.seed, options);
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

std::vector<parallel::TpRule> decoder_tensor_parallel_plan(const CausalLM& part,
                                                           bool loss_parallel) {
  using namespace parallel;
  const DecoderArgs& args = decoder_args(part);
  const bool tied = args.tie_embeddings;
  // The head gathers the sequence and keeps its vocabulary columns for the vocab-parallel loss,
  // or gathers them too.
  TpRule output = colwise("output");
  output.input = InputLayout::kGatherSequence;
  output.output = loss_parallel ? OutputLayout::kAsIs : OutputLayout::kGatherVocab;
  if (tied) output.weight = WeightSplit::kNone;  // it has none: it reads the table's rows
  std::vector<TpRule> plan;
  const bool mtp = mtp_blocks_of(part) > 0;
  if (part.part().embedding || mtp) {
    // The multi-token-prediction blocks look the table up on the head's part too.
    plan.push_back(vocab_parallel_embedding("tok_embeddings"));
  } else if (tied && part.part().head) {
    plan.push_back({"tok_embeddings", WeightSplit::kRows});  // the head's copy, never looked up
  }
  plan.insert(plan.end(), {sequence_parallel("layers.*.attention_norm"),
                           sequence_region("layers.*.attention")});
  if (args.mla) {
    // Latent attention (torchtitan's plan): the projections into the q and kv latents and their
    // norms are whole on every rank (the latents are shared by all heads; their gradients are
    // partial sums), the per-head ones split by heads.
    if (args.mla->q_lora_rank == 0) {
      plan.push_back(colwise("layers.*.attention.wq"));
    } else {
      plan.insert(plan.end(), {{"layers.*.attention.wq_a", WeightSplit::kReplicated},
                               {"layers.*.attention.q_norm", WeightSplit::kReplicated},
                               colwise("layers.*.attention.wq_b")});
    }
    plan.insert(plan.end(), {{"layers.*.attention.wkv_a", WeightSplit::kReplicated},
                             {"layers.*.attention.kv_norm", WeightSplit::kReplicated},
                             colwise("layers.*.attention.wkv_b"),
                             rowwise("layers.*.attention.wo")});
  } else {
    plan.insert(plan.end(), {colwise("layers.*.attention.wq"), colwise("layers.*.attention.wk"),
                             colwise("layers.*.attention.wv"), rowwise("layers.*.attention.wo")});
  }
  if (args.attention_bias) {
    // The column-parallel projections' biases split with their rows; the output projection's
    // is whole, each rank adding its 1 / tp share to the partial sums (see apply_tp).
    plan.insert(plan.end(), {{"layers.*.attention.wq.bias", WeightSplit::kRows},
                             {"layers.*.attention.wk.bias", WeightSplit::kRows},
                             {"layers.*.attention.wv.bias", WeightSplit::kRows},
                             {"layers.*.attention.wo.bias", WeightSplit::kReplicated}});
  }
  if (args.attention_sinks) plan.push_back({"layers.*.attention.sinks", WeightSplit::kRows});
  if (args.qk_norm) {
    // Per-head norms act on this rank's heads: the weight is whole, its gradient a partial sum.
    plan.push_back({"layers.*.attention.q_norm", WeightSplit::kReplicated});
    plan.push_back({"layers.*.attention.k_norm", WeightSplit::kReplicated});
  }
  plan.push_back(sequence_parallel("layers.*.ffn_norm"));
  bool dense = false, sparse = false;
  for (int64_t layer = 0; layer < args.n_layers + args.num_mtp_layers; ++layer) {
    (args.is_moe_layer(layer) ? sparse : dense) = true;
  }
  if (dense) {
    plan.insert(plan.end(),
                {sequence_region("layers.*.feed_forward"), colwise("layers.*.feed_forward.w1"),
                 rowwise("layers.*.feed_forward.w2"), colwise("layers.*.feed_forward.w3")});
  }
  if (sparse) {
    // Every tp rank routes the whole gathered sequence alike (the gate is whole, its gradient a
    // partial sum) and holds a slice of every expert's hidden features: w1/w3 [E, F, D] split
    // along F, w2 [E, D, F] too; the layer's output is a partial sum like the MLP's.
    TpRule w1{"layers.*.moe.experts.w1", WeightSplit::kRows};
    w1.dim = 1;
    TpRule w3 = w1;
    w3.module = "layers.*.moe.experts.w3";
    TpRule w2{"layers.*.moe.experts.w2", WeightSplit::kColumns};
    w2.dim = 2;
    plan.insert(plan.end(), {sequence_region("layers.*.moe"),
                             {"layers.*.moe.router.gate", WeightSplit::kReplicated},
                             w1,
                             w2,
                             w3});
    if (args.moe->router_bias) {
      plan.push_back({"layers.*.moe.router.gate.bias", WeightSplit::kReplicated});
    }
    if (args.moe->expert_biases) {
      // gpt-oss: w1/w3's biases split with their hidden features; w2's whole, shared out as
      // the output projection's.
      TpRule b1{"layers.*.moe.experts.w1_bias", WeightSplit::kRows};
      b1.dim = 1;
      TpRule b3 = b1;
      b3.module = "layers.*.moe.experts.w3_bias";
      plan.insert(plan.end(), {b1, b3, {"layers.*.moe.experts.w2_bias", WeightSplit::kReplicated}});
    }
    if (args.moe->num_shared_experts > 0) {
      plan.insert(plan.end(), {colwise("layers.*.moe.shared_experts.w1"),
                               rowwise("layers.*.moe.shared_experts.w2"),
                               colwise("layers.*.moe.shared_experts.w3")});
    }
  }
  if (mtp) {
    // The depth's input projection acts on sequence shards like the norms around it: whole on
    // every rank, its gradient a partial sum.
    plan.insert(plan.end(), {sequence_parallel("layers.*.enorm"),
                             sequence_parallel("layers.*.hnorm"),
                             {"layers.*.eh_proj", WeightSplit::kReplicated},
                             sequence_parallel("layers.*.mtp_norm")});
  }
  plan.insert(plan.end(), {sequence_parallel("norm"), output});
  return plan;
}

void check_decoder_parallelism(const DecoderArgs& args, const config::JobConfig& config) {
  const int64_t tp = config.parallelism.tensor_parallel_degree;
  const int64_t ep = config.parallelism.expert_parallel_degree;
  if (!args.moe) {
    LOOM_CHECK_AS(InputError, ep <= 1, "parallelism.expert_parallel_degree = ", ep, ": ",
                  config.model.name, " flavor '", config.model.flavor,
                  "' has no mixture-of-experts layers to split; set it to 1");
    for (const auto& [key, value] :
         {std::pair{"moe_load_balance_coeff", config.model.moe_load_balance_coeff},
          std::pair{"moe_aux_loss_coeff", config.model.moe_aux_loss_coeff}}) {
      LOOM_CHECK_AS(InputError, !value, "model.", key, " = ", value.value_or(0), ": ",
                    config.model.name, " flavor '", config.model.flavor,
                    "' has no mixture-of-experts layers; remove the key");
    }
  } else {
    const int64_t etp = config.parallelism.expert_tensor_parallel_degree;
    LOOM_CHECK_AS(InputError, etp == 1 || etp == tp,
                  "parallelism.expert_tensor_parallel_degree = ", etp,
                  ": loom splits the experts over the tensor-parallel ranks like the dense "
                  "layers (expert_tensor_parallel_degree = tensor_parallel_degree = ",
                  tp, "); set it to ", tp, " or 1");
    LOOM_CHECK_AS(
        InputError, args.moe->hidden_dim % tp == 0, "parallelism.tensor_parallel_degree = ", tp,
        " must divide the experts' "
        "hidden width ",
        args.moe->hidden_dim, " of ", config.model.name, " flavor '", config.model.flavor, "'");
    LOOM_CHECK_AS(InputError, args.moe->num_experts % ep == 0,
                  "parallelism.expert_parallel_degree = ", ep, " must divide the ",
                  args.moe->num_experts, " experts of ", config.model.name, " flavor '",
                  config.model.flavor, "': each expert-parallel rank holds the same number");
  }
  const int64_t cp = config.parallelism.context_parallel_degree;
  if (config.optimizer.qk_clip_threshold > 0) {
    LOOM_CHECK_AS(InputError, !args.qk_norm,
                  "optimizer.qk_clip_threshold = ", config.optimizer.qk_clip_threshold, ": ",
                  config.model.name, " flavor '", config.model.flavor,
                  "' normalizes q and k per head (qk_norm), which undoes any scale of their "
                  "projections: QK-clip cannot act there; set it to 0");
    LOOM_CHECK_AS(InputError, cp <= 1,
                  "optimizer.qk_clip_threshold with "
                  "parallelism.context_parallel_degree = ",
                  cp,
                  ": the largest logit over the other ranks' keys is not measured yet; set one of "
                  "them to 0 / 1");
    LOOM_CHECK_AS(InputError, !config.fault_tolerance.enable,
                  "optimizer.qk_clip_threshold with fault_tolerance.enable: replica groups would "
                  "clip by their own logits and drift apart (not reduced across groups yet); set "
                  "it to 0");
  }
  if (cp > 1) {
    const bool head_tail =
        config.parallelism.context_parallel_load_balancer.value_or("none") == "headtail";
    const int64_t chunks = head_tail ? 2 * cp : cp;
    std::vector<std::pair<const char*, int64_t>> lengths = {
        {"training.seq_len", config.training.seq_len}};
    if (config.validation.enable)
      lengths.emplace_back("validation.seq_len", config.validation.seq_len);
    for (const auto& [key, seq] : lengths) {
      LOOM_CHECK_AS(InputError, seq % (chunks * tp) == 0, key, " = ", seq, " must split into ",
                    chunks, " context-parallel chunks",
                    tp > 1 ? " of a multiple of tensor_parallel_degree tokens" : "",
                    " (parallelism.context_parallel_degree = ", cp,
                    head_tail ? ", head-tail load balancing" : "", ")");
    }
  }
  if (tp <= 1) return;
  LOOM_CHECK_AS(InputError, args.n_heads % tp == 0 && args.kv_heads() % tp == 0,
                "parallelism.tensor_parallel_degree = ", tp,
                " must divide the attention heads "
                "of ",
                config.model.name, " flavor '", config.model.flavor, "' (n_heads ", args.n_heads,
                ", n_kv_heads ", args.kv_heads(), "): tensor parallelism splits whole heads");
}

std::vector<parallel::FsdpUnit> decoder_fsdp_units(
    CausalLM& model, std::shared_ptr<distributed::Comm> expert_group) {
  std::map<std::string, std::vector<std::string>> params_of;
  std::map<std::string, std::vector<std::string>> experts_of;  // by block
  for (const auto& item : model.module().named_parameters()) {
    const std::string& name = item.key();
    std::string module = name.substr(0, name.rfind('.'));  // "layers.3.attention.wq"
    if (module.rfind("layers.", 0) == 0) {
      module = module.substr(0, module.find('.', std::string("layers.").size()));  // "layers.3"
      if (name.find(".moe.experts.") != std::string::npos) {
        experts_of[module].push_back(name);
        continue;
      }
    }
    params_of[module].push_back(name);
  }
  // A tied table is gathered from the embedding's forward to the head's backward: its unit
  // spans the whole part (FSDP2 puts it in the root module for the same reason). A head part
  // without the embedding holds the table as a parameter of the head's unit.
  const bool tied = decoder_args(model).tie_embeddings && model.part().head;
  const bool spans = tied && model.part().embedding;
  std::vector<parallel::FsdpUnit> units;
  for (const std::string& module : model.hookable_modules()) {
    auto params = params_of[module];
    // The final norm and the output projection run back to back: one unit.
    if (module == "output" && !units.empty() && units.back().name == "norm") {
      units.back().name = "norm+output";
      units.back().modules.push_back(module);
      for (auto& p : params) units.back().parameters.push_back(std::move(p));
      if (tied && !spans) units.back().parameters.push_back("tok_embeddings.weight");
      continue;
    }
    units.push_back({module, {module}, std::move(params), nullptr});
    auto experts = experts_of.find(module);
    if (experts != experts_of.end()) {
      units.push_back(
          {module + ".moe.experts", {module + ".moe"}, std::move(experts->second), expert_group});
    }
  }
  if (spans) {
    // [tok_embeddings] ... [norm+output] -> [tok_embeddings ... output] first, blocks after.
    parallel::FsdpUnit head = std::move(units.back());
    units.pop_back();
    units.front().name = "tok_embeddings+norm+output";
    for (auto& m : head.modules) units.front().modules.push_back(std::move(m));
    for (auto& p : head.parameters) units.front().parameters.push_back(std::move(p));
  }
  return units;
}

namespace {

// Under pipeline parallelism a tied table lives on the first stage (looked up) and the last (the
// head's copy): both copies' placements name the pair, and their gradients are summed.
// Multi-token prediction's table on the last stage (looked up there) is such a copy too.
void tie_pipeline_copies(parallel::ParallelModel& out, const parallel::ParallelContext& context) {
  const auto& dims = context.runtime.dims();
  if (dims.pp <= 1 || out.parts.empty()) return;
  const DecoderArgs& args = decoder_args(*out.parts.front());
  if (!args.tie_embeddings && args.num_mtp_layers == 0) return;
  bool original = false, copy = false;
  for (const auto& part : out.parts) {
    original = original || part->part().embedding;
    copy = copy || (part->part().head && !part->part().embedding);
  }
  if (!original && !copy) return;
  LOOM_CHECK_AS(InputError, !(original && copy),
                args.tie_embeddings ? "tied embeddings" : "multi-token prediction",
                " needs the embedding and the head on different pipeline ranks; this rank holds "
                "both (a schedule that puts the first and last stages on one rank, or "
                "parallelism.module_fqns_per_model_part?)");
  std::vector<at::Tensor> tensors;
  for (auto& p : out.parameters) {
    if (p.name != "tok_embeddings.weight") continue;
    p.placement = p.placement.replicate(parallel::tied_axis(original), /*partial=*/true);
    tensors.push_back(p.tensor);
  }
  auto pp = context.runtime.group_ptr(MeshGroup::pp);
  const int peer = original ? pp->size() - 1 : 0;
  out.wrappers.push_back(
      std::make_unique<parallel::TiedParameterSync>(std::move(tensors), pp, peer));
}

// The job's split of each sequence over the cp ranks (parallelism.context_parallel_*).
std::shared_ptr<parallel::ContextParallel> make_context_parallel(
    const parallel::ParallelContext& context) {
  const auto& p = context.config.parallelism;
  const std::string balancer = p.context_parallel_load_balancer.value_or("none");
  LOOM_CHECK_AS(InputError, balancer == "headtail" || balancer == "none",
                "parallelism.context_parallel_load_balancer = \"", balancer,
                "\": loom balances by \"headtail\" (or \"none\": contiguous shares)");
  // The run's log names what the split computes with (a CP run named neither before).
  if (context.runtime.rank() == 0) {
    const std::string& method = p.context_parallel_rotate_method;
    log::get("parallel")
        ->info(
            "context parallelism: cp {}, rotate method \"{}\" ({}), load balancer \"{}\", "
            "attention mask \"{}\"",
            context.runtime.dims().cp, method,
            method == "alltoall" ? "ring: k/v passed rank to rank, merged by log-sum-exp"
                                 : "k/v all-gathered before attention",
            balancer, context.config.model.attn_mask_type);
  }
  return std::make_shared<parallel::ContextParallel>(context.runtime.group_ptr(MeshGroup::cp),
                                                     balancer == "headtail"
                                                         ? parallel::ContextBalancer::kHeadTail
                                                         : parallel::ContextBalancer::kNone,
                                                     p.context_parallel_rotate_method);
}

// Chains QK-clip (qk_clip.h) after whatever the model already does after a step.
void add_qk_clip(ParallelModel& out, const std::vector<std::unique_ptr<CausalLM>>& parts,
                 const parallel::ParallelContext& context) {
  const QkClipOptions options{context.config.optimizer.qk_clip_threshold,
                              context.config.optimizer.qk_clip_alpha};
  auto clip =
      make_qk_clip(parts, out.parameters, options, context.runtime.group_ptr(MeshGroup::loss),
                   context.runtime.world_group_ptr());
  auto before = std::move(out.after_optimizer_step);
  out.after_optimizer_step = [before, clip](const parallel::AfterStep& step) {
    parallel::ModelMetrics metrics = before ? before(step) : parallel::ModelMetrics{};
    for (auto& entry : clip(step)) metrics.push_back(std::move(entry));
    return metrics;
  };
}

// Multi-token prediction's loss around the head's (mtp.h), its weight schedule, and the depths'
// losses as metrics (`mtp/loss_<k>`: the logged step's summed token losses over every rank,
// divided by its targets; tensor-parallel copies scale both alike).
void add_multi_token_prediction(ParallelModel& out, int64_t depths,
                                const parallel::ParallelContext& context) {
  struct State {
    double scale = 0;
    std::vector<at::Tensor> sums;  // per microbatch and depth: [loss sum, targets]
  };
  auto state = std::make_shared<State>();
  const config::ModelSection model = context.config.model;
  out.mtp_depths = depths;
  out.begin_step = [state, model](int64_t step) {
    const bool switched = model.mtp_scale_switch_step > 0 && step >= model.mtp_scale_switch_step;
    state->scale = switched ? model.mtp_scale_after_switch : model.mtp_scale;
    state->sums.clear();
  };
  state->scale = model.mtp_scale;
  auto base = std::move(out.loss);
  out.loss = [state, base, depths](const at::Tensor& output, const at::Tensor& labels) {
    // Validation (and any batch without the depths' labels) scores the next token alone.
    if (output.size(0) == labels.size(0)) return base(output, labels);
    return mtp_loss_sum(base, output, labels, depths, state->scale, &state->sums);
  };
  auto before = std::move(out.after_optimizer_step);
  auto world = context.runtime.world_group_ptr();
  out.after_optimizer_step = [before, state, depths, world](const parallel::AfterStep& step) {
    parallel::ModelMetrics metrics = before ? before(step) : parallel::ModelMetrics{};
    if (!step.log_step) return metrics;
    at::Tensor totals = at::zeros({depths, 2}, at::kDouble);
    for (size_t i = 0; i < state->sums.size(); ++i) {
      totals[static_cast<int64_t>(i) % depths] += state->sums[i].to(at::kCPU, at::kDouble);
    }
    state->sums.clear();
    if (world && world->size() > 1) world->all_reduce(totals);
    const auto t = totals.accessor<double, 2>();
    for (int64_t k = 0; k < depths; ++k) {
      metrics.emplace_back("mtp/loss_" + std::to_string(k + 1),
                           t[k][1] > 0 ? t[k][0] / t[k][1] : 0.0);
    }
    return metrics;
  };
}

}  // namespace

parallel::ParallelModel parallelize_decoder(std::vector<std::unique_ptr<CausalLM>> parts,
                                            const parallel::ParallelContext& context) {
  const auto& dims = context.runtime.dims();
  LOOM_CHECK(!parts.empty(), "parallelize_decoder needs at least one model part");
  ParallelModel out;
  // 0. Context parallelism: each layer's attention gathers the other cp ranks' keys and values.
  if (dims.cp > 1) {
    out.context = make_context_parallel(context);
    for (auto& part : parts) part->set_attention_backend(out.context->backend());
  }
  const std::map<std::string, Placement>* head_boxes = nullptr;
  std::string head_weight_name;
  std::vector<std::map<std::string, Placement>> boxes;
  boxes.reserve(parts.size());
  for (auto& part : parts) {
    LOOM_CHECK(part->module().parameters().empty() || part->module().parameters().front().is_meta(),
               "parallelize_decoder expects model parts built on the meta device");
    // 1. Tensor and sequence parallelism: boxes and region hooks; the routed experts split over
    // the ep ranks.
    boxes.push_back(apply_tp(*part, context));
    parallel::split_experts(*part, boxes.back(), expert_axis(context));
    if (part->part().head) {
      head_boxes = &boxes.back();
      head_weight_name = head_weight(*part);
    }
    // 2. Activation checkpointing, inside the data-parallel wrappers' unit hooks.
    part->apply_activation_checkpointing(context.config.activation_checkpoint);
  }
  out.loss = make_loss(head_boxes, head_weight_name, context);
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
  const int64_t dim = decoder_args(*parts.front()).dim;
  // 5. Mixture-of-experts layers: token dispatch over ep, balancing state and its update.
  parallelize_moe_layers(out, parts, context);
  // 6. QK-clip after each optimizer step, after the experts' bias update.
  if (context.config.optimizer.qk_clip_threshold > 0) add_qk_clip(out, parts, context);
  // 7. Multi-token prediction's loss around the head's, and its metrics.
  if (const int64_t depths = decoder_args(*parts.front()).num_mtp_layers; depths > 0) {
    add_multi_token_prediction(out, depths, context);
  }
  for (auto& part : parts) out.parts.push_back(std::move(part));
  // 8. A table's two pipeline copies (tied, or multi-token prediction's), once each copy's
  // gradient is complete.
  tie_pipeline_copies(out, context);
  auto chain = std::make_unique<parallel::GradientSyncChain>();
  for (const auto& wrapper : out.wrappers) chain->add(wrapper.get());
  out.description = chain->describe();
  out.gradient_sync = std::move(chain);
  // Between pipeline stages: the hidden state, sequence-sharded under TP (sequence parallel),
  // in the dtype the blocks compute their residual stream in.
  const int64_t tp = dims.tp;
  out.boundary_shape = [dim, tp](int64_t rows, int64_t seq) {
    return std::vector<int64_t>{rows, seq / tp, dim};
  };
  out.boundary_dtype = uses_fsdp(context) ? context.autocast_dtype.value_or(context.param_dtype)
                                          : context.param_dtype;
  return out;
}

}  // namespace loom::models
