#include "loom/parallel/tensor_parallel.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "loom/core/check.h"
#include "loom/distributed/comm.h"
#include "loom/parallel/tp_regions.h"

namespace loom::parallel {

TpRule colwise(std::string module) { return {std::move(module), WeightSplit::kRows}; }
TpRule rowwise(std::string module) { return {std::move(module), WeightSplit::kColumns}; }
TpRule sequence_parallel(std::string module) {
  return {std::move(module), WeightSplit::kReplicated};
}
TpRule vocab_parallel_embedding(std::string module) {
  return {std::move(module), WeightSplit::kRows, InputLayout::kVocabIds,
          OutputLayout::kReduceScatterSequence};
}
TpRule sequence_region(std::string module) {
  return {std::move(module), WeightSplit::kNone, InputLayout::kGatherSequence,
          OutputLayout::kReduceScatterSequence};
}

namespace {

std::vector<std::string_view> components(std::string_view name) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

}  // namespace

bool matches_module_pattern(const std::string& pattern, const std::string& name) {
  const auto want = components(pattern);
  const auto have = components(name);
  if (want.size() != have.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != "*" && want[i] != have[i]) return false;
  }
  return true;
}

namespace {

const TpRule* weight_rule(const std::vector<TpRule>& plan, const std::string& module) {
  for (const auto& rule : plan) {
    if (rule.weight != WeightSplit::kNone && matches_module_pattern(rule.module, module)) {
      return &rule;
    }
  }
  return nullptr;
}

// A rule that matches no parameter and no hook point of a whole model is a typo in the plan (a
// pipeline stage's part legitimately lacks the embedding, the head or most layers).
void check_every_rule_used(const models::CausalLM& model, const std::vector<TpRule>& plan,
                           const std::map<std::string, Placement>& boxes,
                           const std::vector<std::string>& points) {
  const auto& part = model.part();
  if (!part.embedding || !part.head || part.first_layer != 0) return;
  for (const auto& rule : plan) {
    bool used = false;
    for (const auto& [name, box] : boxes) {
      used = used || (rule.weight != WeightSplit::kNone &&
                      (matches_module_pattern(rule.module, name.substr(0, name.rfind('.'))) ||
                       matches_module_pattern(rule.module, name)));
    }
    for (const auto& point : points) used = used || matches_module_pattern(rule.module, point);
    LOOM_CHECK(used, "tensor-parallel plan: rule '", rule.module,
               "' matches no parameter or hook point of the model");
  }
}

// This rank's box of one weight under `split`.
Placement split_box(const std::string& name, const Placement& box, const TpRule& rule,
                    const MeshAxis& tp) {
  const WeightSplit split = rule.weight;
  if (split == WeightSplit::kReplicated) return box.replicate(tp, /*partial_gradient=*/true);
  const int64_t dim = rule.dim >= 0 ? rule.dim : split == WeightSplit::kRows ? 0 : 1;
  LOOM_CHECK(static_cast<int64_t>(box.lengths.size()) > dim, "tensor parallelism: ", name,
             " has no dim ", dim, " to split");
  const int64_t extent = box.lengths[static_cast<size_t>(dim)];
  LOOM_CHECK_AS(InputError, shard_range(extent, tp.size - 1, tp.size).count > 0,
                "parallelism.tensor_parallel_degree = ", tp.size, " leaves some ranks without a "
                "piece of ", name, " (dim ", dim, " has ", extent,
                "): use a degree that splits it");
  return box.shard(dim, tp);
}

// The forward hooks that move one module's input and output between layouts.
models::ForwardHooks region_hooks(const TpRule& rule, const Placement* weight, const MeshAxis& tp) {
  models::ForwardHooks hooks;
  distributed::Comm* comm = tp.comm.get();
  if (rule.input == InputLayout::kGatherSequence) {
    hooks.input = [comm](const at::Tensor& x) { return gather_sequence(x, *comm); };
  }
  std::shared_ptr<at::Tensor> foreign;  // ids outside this rank's rows, for the output mask
  if (rule.input == InputLayout::kVocabIds) {
    LOOM_CHECK(weight != nullptr, "vocab-parallel ", rule.module, " has no split weight");
    const int64_t first = weight->offsets[0], count = weight->lengths[0];
    foreign = std::make_shared<at::Tensor>();
    hooks.input = [first, count, foreign](const at::Tensor& ids) {
      *foreign = ids.lt(first).logical_or(ids.ge(first + count));
      return (ids - first).masked_fill(*foreign, 0);
    };
  }
  const OutputLayout output = rule.output;
  int64_t full = 0;
  if (output == OutputLayout::kGatherVocab) {
    LOOM_CHECK(weight != nullptr, "vocab-gathering ", rule.module, " has no split weight");
    full = weight->global_shape[0];
  }
  if (foreign || output != OutputLayout::kAsIs) {
    hooks.after = [comm, foreign, output, full](const at::Tensor& out) {
      at::Tensor y = foreign ? out.masked_fill(foreign->unsqueeze(-1), 0) : out;
      if (foreign) foreign->reset();
      if (output == OutputLayout::kReduceScatterSequence) return reduce_scatter_sequence(y, *comm);
      if (output == OutputLayout::kGatherVocab) return gather_last_dim(y, *comm, full);
      return y;
    };
  }
  return hooks;
}

}  // namespace

std::map<std::string, Placement> apply_tensor_parallel(models::CausalLM& model,
                                                       const std::vector<TpRule>& plan,
                                                       const MeshAxis& tp,
                                                       std::map<std::string, Placement> boxes) {
  LOOM_CHECK(tp.comm != nullptr && tp.comm->size() == tp.size, "tensor parallelism needs its group");
  std::map<std::string, at::Tensor> params;
  for (const auto& item : model.module().named_parameters()) params[item.key()] = item.value();
  for (auto& [name, box] : boxes) {
    const auto dot = name.rfind('.');
    if (dot == std::string::npos) continue;
    const TpRule* rule = name.substr(dot + 1) == "weight" ? weight_rule(plan, name.substr(0, dot))
                                                          : weight_rule(plan, name);
    if (rule == nullptr) continue;
    box = split_box(name, box, *rule, tp);
    if (rule->weight == WeightSplit::kReplicated) continue;
    const at::Tensor& current = params.at(name);
    LOOM_CHECK(current.is_meta(), "apply_tensor_parallel expects a model on the meta device");
    model.replace_parameter(name, at::empty(box.lengths, current.options()));
  }
  const auto points = model.hook_points();
  check_every_rule_used(model, plan, boxes, points);
  for (const std::string& point : points) {
    for (const auto& rule : plan) {
      if (rule.input == InputLayout::kAsIs && rule.output == OutputLayout::kAsIs) continue;
      if (!matches_module_pattern(rule.module, point)) continue;
      auto weight = boxes.find(point + ".weight");
      model.set_forward_hooks(point, "tp",
                              region_hooks(rule, weight == boxes.end() ? nullptr : &weight->second,
                                           tp));
      break;
    }
  }
  return boxes;
}

TensorParallelGradientSync::TensorParallelGradientSync(
    const std::vector<ModelParameter>& parameters, std::shared_ptr<distributed::Comm> tp)
    : tp_(std::move(tp)) {
  for (const auto& p : parameters) {
    for (const auto& axis : p.placement.partial_grad) {
      if (axis.comm == tp_) partial_.push_back(p.tensor);
    }
  }
}

void TensorParallelGradientSync::finish() {
  if (partial_.empty() || tp_->size() == 1) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& t : partial_) {
    if (t.grad().defined()) grads.push_back(t.grad());
  }
  if (grads.empty()) return;
  std::vector<at::Tensor> flats;
  for (const auto& g : grads) flats.push_back(g.reshape({-1}));
  at::Tensor flat = at::cat(flats);
  tp_->all_reduce(flat);
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

std::string TensorParallelGradientSync::describe() const {
  return "TP over group '" + tp_->name() + "' (" + std::to_string(tp_->size()) +
         " ranks; all-reduce of " + std::to_string(partial_.size()) +
         " sequence-parallel gradients)";
}

}  // namespace loom::parallel
