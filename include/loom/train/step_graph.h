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
// Several ranks: the data-parallel wrappers (DDP, FSDP, HSDP) are recorded with the step. Their
// collectives (NCCL) are captured into the graph; their host-side bookkeeping (buckets' and
// units' states, works) ends every step as it began, so the recorded launches are the ones each
// step needs. What the host no longer sees during a replay is put back around it: the step's
// traffic is added to the byte counters (measured on the last eager step), and each replay is an
// entry of the flight recorder on which the host blocks before the next step, so a replay that
// hangs is named by the collective watchdog like a collective.
//
// A job the graph cannot hold trains eagerly, with one log line naming why (step_graph_refusal):
// anything the host decides from the data or the step count inside a step (MoE routing,
// document masks, multi-token prediction's schedule, converters' weight caches), tensor,
// pipeline, context and expert parallelism, collectives staged through the host (ranks sharing
// a GPU), and fault tolerance.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/cuda_support.h"
#include "loom/data/batch_source.h"
#include "loom/distributed/comm.h"
#include "loom/distributed/flight_recorder.h"

namespace loom::train {

struct Run;

// What decides whether a job's step can be recorded.
struct StepGraphFacts {
  bool cuda = false;        // the job's device is a GPU
  bool cpu_replay = false;  // debug.cuda_graph_on_cpu: the path on CPU, replayed eagerly
  int64_t world_size = 1;
  std::string model_parallel;  // "tp 2, pp 2": the degrees above one besides data parallelism
  bool collectives_through_host = false;  // ranks sharing a GPU (CommOptions::cuda_through_host)
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

// The replays of a several-rank job in flight. Each is an entry of the flight recorder
// ("step_graph_replay" on the group "world/step_graph" of every rank, numbered from 1 by
// replay); once more than
// `in_flight` are queued the host waits for the oldest, marked as waited for, so the collective
// watchdog measures a replay that never ends (a dead peer inside its collectives) from there.
class ReplayQueue {
 public:
  ReplayQueue(device::StepGraph& graph, distributed::FlightRecorder* recorder,
              std::vector<int> world_ranks, size_t in_flight);
  // Replays the graph and waits for the oldest replays past `in_flight`.
  void replay();
  // Waits until at most `in_flight` replays are queued.
  void wait_until(size_t in_flight);

 private:
  device::StepGraph& graph_;
  distributed::FlightRecorder* recorder_;  // null: nothing recorded (one rank, tests)
  std::vector<int> world_ranks_;
  size_t in_flight_;
  int64_t replays_ = 0;
  std::deque<uint64_t> queued_;  // their recorder entries, oldest first
};

class GraphedStep {
 public:
  static constexpr int64_t kEagerSteps = 2;
  // Replays one rank may queue ahead of the device (two: the device never waits for the host).
  // Several ranks wait for each replay (the flight recorder's watch, see ReplayQueue).
  static constexpr size_t kReplaysInFlight = 2;

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

  // Every group's byte counters (the graph's collectives count only while the host runs them).
  std::vector<distributed::TrafficCounts> traffic() const;
  void set_traffic(const std::vector<distributed::TrafficCounts>& traffic);

  Run& run_;
  std::unique_ptr<device::StepGraph> graph_;
  std::unique_ptr<ReplayQueue> replays_;
  std::vector<distributed::TrafficCounts> step_traffic_;  // one step's, from the last eager step
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
