// What a model family's parallelize function receives and returns (registered on its
// ModelSpec). It applies, in order, tensor parallelism, activation checkpointing, then
// FSDP/HSDP or DDP, materializes the local parameters, and hands the trainer everything it
// needs without the trainer knowing which wrappers exist.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/parallel/gradient_sync.h"
#include "loom/parallel/placement.h"
#include "loom/protocols/causal_lm.h"

namespace loom::distributed {
class ParallelRuntime;
struct ParallelDims;
}  // namespace loom::distributed

namespace loom::parallel {

class ContextParallel;

struct ParallelContext {
  const config::JobConfig& config;
  distributed::ParallelRuntime& runtime;
  at::Device device{at::kCPU};
  uint64_t seed = 0;
  at::ScalarType param_dtype = at::kFloat;       // training.dtype
  std::optional<at::ScalarType> autocast_dtype;  // mixed_precision_param where it applies
};

// A parameter the optimizer steps: its global name, the local tensor, and where it sits.
struct ModelParameter {
  std::string name;
  at::Tensor tensor;
  Placement placement;
};

// Named scalars a model reports for the metrics log ("moe/load_max_mean", ...).
using ModelMetrics = std::vector<std::pair<std::string, double>>;

// Summed token cross-entropy of the last part's output against the labels (the trainer divides
// by the step's valid tokens).
using LossFunction = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& labels)>;

// What the model's after-step rules learn of the step that ran.
struct AfterStep {
  bool log_step = false;
  // training.skip_nonfinite_steps: 1 where the optimizer skipped this step's update (a 0-d
  // float32 tensor on the device, read there), 0 otherwise; undefined when skipping is off. A
  // skipped step leaves the model's own state (QK-clip's scales, the balancing bias) as it was.
  at::Tensor skipped;
};

struct ParallelModel {
  // One part without pipeline parallelism; the parts this rank runs otherwise.
  std::vector<std::unique_ptr<models::CausalLM>> parts;
  std::vector<ModelParameter> parameters;
  // State the model keeps besides its parameters (a mixture of experts' balancing bias): saved
  // and loaded with checkpoints, never optimized. Placements as for parameters.
  std::vector<ModelParameter> buffers;
  // Context parallelism: how a batch is split over the cp ranks (null without it).
  std::shared_ptr<ContextParallel> context;
  // Declared after `parts`: destroyed first (wrappers unhook themselves from the parts).
  std::vector<std::unique_ptr<GradientSync>> wrappers;
  std::unique_ptr<GradientSync> gradient_sync;
  // Per part: the data-parallel synchronization of that part's parameters alone (null where it
  // has none), for the pipeline runner to arm on each stage's last backward. `gradient_sync`
  // still finishes the step for every part.
  std::vector<GradientSync*> part_syncs;
  LossFunction loss;
  // Autocast for forward and loss; nullopt where the wrappers compute in their own dtype (FSDP's
  // mixed_precision_param).
  std::optional<at::ScalarType> autocast;
  std::string description;  // one line for the log: wrappers and their groups
  // State the model updates after each optimizer step with the groups it was parallelized over
  // (a mixture of experts' balancing bias); empty for none. Family hooks call it
  // (ModelSpec::after_optimizer_step). On a logged step (`log_step`) it returns named scalars
  // for metrics.jsonl, the same on every rank. A step whose update was skipped changes no state.
  std::function<ModelMetrics(const AfterStep& step)> after_optimizer_step;
  // What the model needs to know before each step's forwards (multi-token prediction's weight
  // schedule); empty for none. The trainer calls it with the step about to run.
  std::function<void(int64_t step)> begin_step;
  // Multi-token-prediction depths the training loss expects (the step runners attach each
  // depth's tokens and labels to a training batch; validation scores the next token alone).
  int64_t mtp_depths = 0;
  // What crosses a pipeline stage boundary for a microbatch of (rows, seq) tokens: the hidden
  // state's local shape and dtype under this layout.
  std::function<std::vector<int64_t>(int64_t rows, int64_t seq)> boundary_shape;
  at::ScalarType boundary_dtype = at::kFloat;

  std::vector<at::Tensor> tensors() const;
  std::vector<Placement> placements() const;
  // The wrapper of type W among `wrappers`, or null (tests and tools, never the trainer).
  template <typename W>
  W* find() const {
    for (const auto& w : wrappers) {
      if (auto* typed = dynamic_cast<W*>(w.get())) return typed;
    }
    return nullptr;
  }
};

// A local box of parameter `name` drawn from its (seed, name) generator: the global tensor is
// drawn on `options`' device one parameter at a time, and the box cut out of it. The one
// materialization path for every layout.
// Whether the job shards its parameters with FSDP: over dp_shard x cp ranks, or on one rank when
// debug.force_fsdp asks (the one rule the parallelize functions, the trainer and its memory
// estimate share).
bool uses_fsdp(const distributed::ParallelDims& dims, const config::JobConfig& config);

at::Tensor materialize_local(models::CausalLM& model, const std::string& name,
                             const Placement& placement, const at::TensorOptions& options,
                             uint64_t seed);

}  // namespace loom::parallel
