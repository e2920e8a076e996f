// Whole-step CUDA graphs (training.cuda_graph): the training step -- zero_grad, each
// microbatch's forward and backward, clipping, the optimizer -- recorded once as a CUDA graph
// and replayed every step after, so the host launches one graph instead of thousands of kernels.
//
// What changes from step to step lives in fixed device buffers that the recorded kernels read
// when they run: the microbatches' tokens and labels (copied in before each step), the step's
// valid-token count, the learning rate and the step counts (optim::Optimizer::
// keep_scalars_on_device). The first kEagerSteps steps run eagerly on the graph's stream, so
// that cuBLAS's handles, the models' lazily made caches and the optimizer's state exist before
// the recording; the next step is recorded, then replayed. The loss and gradient norm are copied
// out of the graph's memory after each step and read at logging steps as before.
//
// A job the graph cannot hold trains eagerly, with one log line naming why (step_graph_refusal):
// anything the host decides from the data or the step count inside a step (MoE routing,
// document masks, multi-token prediction's schedule, converters' weight caches), collectives
// (several ranks), and fault tolerance.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/cuda_support.h"
#include "loom/data/batch_source.h"

namespace loom::train {

struct Run;

// What decides whether a job's step can be recorded.
struct StepGraphFacts {
  bool cuda = false;        // the job's device is a GPU
  bool cpu_replay = false;  // debug.cuda_graph_on_cpu: the path on CPU, replayed eagerly
  int64_t world_size = 1;
  bool causal_mask = true;        // model.attn_mask_type causal (documents need host-side offsets)
  bool model_step_hooks = false;  // per-step model work: MoE balancing, QK-clip, MTP's schedule
  int64_t mtp_depths = 0;
  bool converters = false;  // float8 linears or experts (host-side weight-cast caches)
  bool fault_tolerance = false;
  bool layer_grad_norms = false;         // metrics.log_layer_grad_norms
  bool step_breakdown = false;           // metrics.step_breakdown's host timers inside the step
  bool optimizer_device_scalars = true;  // every group's algorithm reads lr/steps on the device
  std::string optimizer;
};

StepGraphFacts step_graph_facts(const Run& run);

// Why the step cannot be recorded, or nullopt.
std::optional<std::string> step_graph_refusal(const StepGraphFacts& facts);

// A StepGraph that records nothing: capture keeps the body and replay runs it (CPU, tests).
std::unique_ptr<device::StepGraph> eager_step_graph();

class GraphedStep {
 public:
  static constexpr int64_t kEagerSteps = 2;

  GraphedStep(Run& run, std::unique_ptr<device::StepGraph> graph);

  struct Outputs {
    at::Tensor loss;       // this rank's part of the step's loss, float64 on the device
    at::Tensor grad_norm;  // the global gradient norm before clipping
  };
  // One optimizer step over `micro` (host batches of the job's fixed shape) with `valid_tokens`
  // (the step's, over the loss group) and the base learning rate `lr`.
  Outputs step(const std::vector<data::Batch>& micro, double valid_tokens, double lr);

  // Steps run so far and whether the graph was recorded (for the log and tests).
  int64_t steps_run() const { return steps_run_; }
  bool recorded() const { return recorded_; }

 private:
  void load(const std::vector<data::Batch>& micro, double valid_tokens);
  // The recorded work: reads only the fixed buffers and the optimizer's device scalars.
  void body();

  Run& run_;
  std::unique_ptr<device::StepGraph> graph_;
  std::vector<data::Batch> buffers_;  // the microbatches' tokens and labels on the device
  at::Tensor valid_tokens_;           // float32 0-d on the device
  at::Tensor loss_, grad_norm_;       // the body's outputs (the graph's memory once recorded)
  int64_t steps_run_ = 0;
  bool recorded_ = false;
};

// The graphed step of `run` when training.cuda_graph asks for one and the job can be recorded;
// null (eager steps) otherwise. Logs which, and why not.
std::unique_ptr<GraphedStep> make_graphed_step(Run& run);

}  // namespace loom::train
