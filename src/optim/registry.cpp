#include "loom/optim/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "loom/core/check.h"

namespace loom::optim {

// The optimizers loom knows, one line each: the file of X(id) defines `OptimizerKind id_kind()`.
#define LOOM_OPTIMIZER_KINDS(X) X(adamw) X(adam) X(muon)

#define LOOM_DECLARE_KIND(id) OptimizerKind id##_kind();
LOOM_OPTIMIZER_KINDS(LOOM_DECLARE_KIND)
#undef LOOM_DECLARE_KIND

const char* const kRoles[5] = {"matrix", "embedding", "head", "routing", "scalar"};

namespace {

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

// The section's factors of a role (the matrices' are the base values).
std::pair<double, double> role_factors(const config::OptimizerSection& s, const std::string& role) {
  if (role == "embedding") return {s.embedding_lr_factor, s.embedding_weight_decay_factor};
  if (role == "head") return {s.head_lr_factor, s.head_weight_decay_factor};
  if (role == "routing") return {s.routing_lr_factor, s.routing_weight_decay_factor};
  if (role == "scalar") return {s.scalar_lr_factor, s.scalar_weight_decay_factor};
  return {1.0, 1.0};
}

const OptimizerKind& kind_or_throw(const std::string& name) {
  const OptimizerKind* kind = find_optimizer_kind(name);
  LOOM_CHECK_AS(InputError, kind != nullptr, "optimizer.name: loom implements ", optimizer_names(),
                "; got '", name, "'");
  return *kind;
}

}  // namespace

std::string parameter_role(const std::string& name, at::IntArrayRef global_shape) {
  if (contains(name, "tok_embeddings.")) return "embedding";
  if (name.rfind("output.", 0) == 0) return "head";
  if (contains(name, ".router.")) return "routing";
  // Biases are vectors whatever their stacking (gpt-oss's experts' [E, F]): never orthogonalized.
  const bool bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
  if (global_shape.size() < 2 || bias) return "scalar";
  return "matrix";
}

const std::vector<OptimizerKind>& optimizer_kinds() {
#define LOOM_LIST_KIND(id) id##_kind(),
  static const std::vector<OptimizerKind> kinds = {LOOM_OPTIMIZER_KINDS(LOOM_LIST_KIND)};
#undef LOOM_LIST_KIND
  return kinds;
}

const OptimizerKind* find_optimizer_kind(const std::string& name) {
  for (const auto& kind : optimizer_kinds()) {
    if (kind.name == name) return &kind;
  }
  return nullptr;
}

std::string optimizer_names() {
  std::string names;
  for (const auto& kind : optimizer_kinds()) names += (names.empty() ? "" : ", ") + kind.name;
  return names;
}

std::vector<std::string> check_optimizer_section(const config::OptimizerSection& section) {
  std::vector<std::string> problems;
  if (!find_optimizer_kind(section.name)) {
    problems.push_back(fmt::format("optimizer.name: loom implements {}; got '{}'",
                                   optimizer_names(), section.name));
  }
  return problems;
}

std::unique_ptr<Optimizer> build_optimizer(const config::OptimizerSection& section,
                                           std::vector<NamedParameter> parameters) {
  const OptimizerKind& kind = kind_or_throw(section.name);
  std::map<std::string, std::vector<size_t>> members;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto& p = parameters[i];
    members[parameter_role(p.name, p.placement.global_shape)].push_back(i);
  }
  std::vector<ParameterGroup> groups;
  for (const char* role : kRoles) {
    auto it = members.find(role);
    if (it == members.end()) continue;
    ParameterGroup group;
    group.role = role;
    group.algorithm = kind.algorithm_for(section, role);
    std::tie(group.lr_factor, group.weight_decay_factor) = role_factors(section, role);
    group.members = std::move(it->second);
    groups.push_back(std::move(group));
  }
  return std::make_unique<Optimizer>(section.name, std::move(parameters), std::move(groups),
                                     section.lr, section.weight_decay);
}

std::unique_ptr<Optimizer> build_optimizer(const config::OptimizerSection& section,
                                           const std::vector<at::Tensor>& tensors) {
  std::vector<NamedParameter> parameters;
  for (size_t i = 0; i < tensors.size(); ++i) {
    parameters.push_back(
        {"param." + std::to_string(i), tensors[i], parallel::Placement::whole(tensors[i].sizes())});
  }
  return build_optimizer(section, std::move(parameters));
}

std::vector<std::string> unused_role_factors(
    const config::OptimizerSection& section,
    const std::vector<models::ParameterShape>& parameters) {
  std::set<std::string> present;
  for (const auto& p : parameters) present.insert(parameter_role(p.name, p.shape));
  const std::map<std::string, std::string> holders = {
      {"embedding", "no token embedding"},
      {"head", "no output head of its own: it is tied to the embedding"},
      {"routing", "no router: it is dense"},
      {"scalar", "no vector or bias parameter"}};
  std::vector<std::string> out;
  for (const auto& [role, holder] : holders) {
    if (present.count(role)) continue;
    const auto [lr, weight_decay] = role_factors(section, role);
    auto add = [&](const char* suffix, double value) {
      if (value == 1.0) return;
      out.push_back(
          fmt::format("optimizer.{}_{} = {} (this model has {})", role, suffix, value, holder));
    };
    add("lr_factor", lr);
    add("weight_decay_factor", weight_decay);
  }
  return out;
}

StateFootprint state_footprint(const config::OptimizerSection& section,
                               const std::vector<models::ParameterShape>& parameters) {
  const OptimizerKind& kind = kind_or_throw(section.name);
  std::map<std::string, std::unique_ptr<Algorithm>> rules;  // per role
  double elements = 0, states = 0;
  std::map<std::string, int64_t> params_of;  // "exp_avg + exp_avg_sq" -> parameters
  StateFootprint out;
  for (const auto& p : parameters) {
    const std::string role = parameter_role(p.name, p.shape);
    auto it = rules.find(role);
    if (it == rules.end()) it = rules.emplace(role, kind.algorithm_for(section, role)).first;
    const auto names = it->second->state_names();
    elements += static_cast<double>(p.numel);
    states += static_cast<double>(p.numel) * static_cast<double>(names.size());
    out.matrix_flops += it->second->matrix_flops(p.shape);
    if (it->second->needs_whole_tensor()) {
      const auto numel = static_cast<double>(p.numel);
      if (p.shape.size() == 3) {
        out.whole_stack_elements += numel;
        if (numel > out.largest_whole_stack) {
          out.largest_whole_stack = numel;
          out.largest_whole_stack_experts = static_cast<double>(std::max<int64_t>(p.shape[0], 1));
        }
      } else {
        out.whole_tensor_elements += numel;
        out.largest_whole_tensor = std::max(out.largest_whole_tensor, numel);
      }
    }
    std::string joined;
    for (const auto& n : names) joined += (joined.empty() ? "" : " + ") + n;
    params_of[joined] += p.numel;
  }
  if (elements > 0) out.per_parameter = states / elements;
  for (const auto& [joined, numel] : params_of) {
    out.description +=
        fmt::format("{}{} on {:.3g}M parameters", out.description.empty() ? "" : "; ", joined,
                    static_cast<double>(numel) / 1e6);
  }
  return out;
}

}  // namespace loom::optim
