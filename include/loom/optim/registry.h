// The optimizers loom knows (optimizer.name), and how a job's parameters are grouped for them.
//
// A parameter's role comes from its global name and shape (the same on every rank and layout):
//   matrix     2-D hidden weights and 3-D expert stacks (attention and MLP projections)
//   embedding  tok_embeddings.*
//   head       output.* (the output projection)
//   routing    a mixture of experts' router (*.router.*)
//   scalar     everything of fewer than two dimensions (norms, biases, scalars)
// An optimizer kind maps each role to an update rule; the section's <role>_lr_factor and
// <role>_weight_decay_factor scale the group's lr and weight decay (matrix: 1, the base values).
// AdamW and Adam give every role their own rule; Muon gives matrices Muon and the rest AdamW
// (torch.optim.Muon is for 2-D hidden weights only, as Moonlight and Kimi K2 train).
//
// Adding an optimizer: one file defining an Algorithm and `OptimizerKind <id>_kind()`, plus its
// X(<id>) in LOOM_OPTIMIZER_KINDS (registry.cpp) and its source in src/CMakeLists.txt.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/optim/optimizer.h"
#include "loom/protocols/causal_lm.h"

namespace loom::optim {

extern const char* const kRoles[5];  // matrix, embedding, head, routing, scalar

std::string parameter_role(const std::string& name, at::IntArrayRef global_shape);

struct OptimizerKind {
  std::string name;     // optimizer.name
  std::string summary;  // one line for docs and errors
  // The update rule of the parameters of `role`.
  std::function<std::unique_ptr<Algorithm>(const config::OptimizerSection&, const std::string&)>
      algorithm_for;
};

const std::vector<OptimizerKind>& optimizer_kinds();
// Null when loom has no optimizer of that name.
const OptimizerKind* find_optimizer_kind(const std::string& name);
// "AdamW, Adam, Muon"
std::string optimizer_names();
// Problems with the section (an unknown name, Muon keys out of range), each naming its key.
std::vector<std::string> check_optimizer_section(const config::OptimizerSection& section);

// The optimizer.name optimizer over `parameters` (global names, local tensors, placements),
// grouped by role. Throws InputError for an unknown name.
std::unique_ptr<Optimizer> build_optimizer(const config::OptimizerSection& section,
                                           std::vector<NamedParameter> parameters);
// Tests and tools: whole tensors named "param.<i>" (their role from their shape alone).
std::unique_ptr<Optimizer> build_optimizer(const config::OptimizerSection& section,
                                           const std::vector<at::Tensor>& tensors);

// The optimizer.<role>_lr_factor / <role>_weight_decay_factor keys set to other than 1 whose
// role no parameter of the model has, each with why ("optimizer.routing_lr_factor = 0.5 (this
// model has no router: it is dense)"): a router factor on a dense model, head factors with a
// head tied to the embedding. `parameters`: the whole model's (a summary's).
std::vector<std::string> unused_role_factors(const config::OptimizerSection& section,
                                             const std::vector<models::ParameterShape>& parameters);

// What the planner and the memory estimate count, without building anything: the state tensors
// (each the parameter's size) of the summary's parameters under the section's optimizer, as
// elements per parameter element (AdamW: 2), and a description ("exp_avg + exp_avg_sq").
// Also what the planner charges beyond elementwise work: the FLOPs of a step's matrix work
// (Muon's Newton-Schulz, the whole model once) and the elements of the parameters whose rule
// needs them whole (gathered when FSDP or TP cut them).
struct StateFootprint {
  double per_parameter = 2.0;
  std::string description;
  double matrix_flops = 0;
  double whole_tensor_elements = 0;  // matrices (2-D)
  // Expert stacks (3-D) the rule needs whole per expert: never gathered over the expert dim
  // (whole experts stay on a rank), only over tensor parallelism's cut of each expert.
  double whole_stack_elements = 0;
  // The largest of each (elements) and that stack's experts: what the step holds at a time.
  double largest_whole_tensor = 0;
  double largest_whole_stack = 0;
  double largest_whole_stack_experts = 1;
};
StateFootprint state_footprint(const config::OptimizerSection& section,
                               const std::vector<models::ParameterShape>& parameters);

}  // namespace loom::optim
