// What a training step passes through besides the model, the optimizer and the data: the seam
// where fault-tolerant replica groups (replica_step_hook.h) plug into the trainer's loop, which
// then has no replica branch of its own. A job without them gets the plain hook: every call is
// a no-op, every step commits, one copy of the global batch per step.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/checkpoint/side_state.h"
#include "loom/metrics/metrics.h"

namespace loom::train {

// A stop request (SIGTERM, SIGINT) that reached a hook between steps, on every rank of the job
// at once (the trainer then stops as after a step: exit 128 + signal).
class StepStopped : public std::runtime_error {
 public:
  StepStopped(int signal, const std::string& where)
      : std::runtime_error("stopped by signal " + std::to_string(signal) + " " + where),
        signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

// Where training stands besides the model and the optimizer: what healing from another group
// carries over (that group's values replace this one's).
struct TrainPosition {
  int64_t tokens_seen = 0;
  int64_t lr_step_offset = 0;
  int64_t elapsed_ms = 0;
};

class StepHook {
 public:
  virtual ~StepHook() = default;
  // Before the step after `committed`: the step training continues from. A hook that moved this
  // rank forward (healed it from a peer) returns a later step and has updated `position`; the
  // trainer then moves its data loader there. Throws StepStopped when a stop signal ends the
  // wait (on every rank of the group).
  virtual int64_t begin_step(int64_t committed, TrainPosition& /*position*/) { return committed; }
  // After the gradient sync inside this rank's job, before clipping: the gradients of the local
  // tensors and this rank's loss part (`valid_tokens`: the step's tokens here) as the whole job
  // sees them.
  virtual void reduce_gradients(at::Tensor& /*loss_part*/, double /*valid_tokens*/) {}
  // Whether the step's update may be applied; false: the trainer discards it and retries the
  // same batch.
  virtual bool commit(int64_t /*step*/) { return true; }
  // After the optimizer step (semi-synchronous groups meet here).
  virtual void after_optimizer_step(int64_t /*step*/) {}

  // For the metrics: copies of the global batch this step trained (tokens_seen counts each), the
  // quorum report of the step, the group this rank healed from at its begin_step, and the bytes
  // this rank sent outside the runtime's process groups.
  virtual int64_t batch_copies() const { return 1; }
  virtual std::optional<metrics::QuorumMetrics> quorum(int64_t /*discarded_steps*/) const {
    return std::nullopt;
  }
  virtual std::optional<int64_t> healed_from() const { return std::nullopt; }
  virtual uint64_t wire_bytes() const { return 0; }
  // What checkpoints keep of the hook's own per-parameter state (semi-synchronous groups: the
  // period's start and DiLoCo's outer momentum).
  virtual std::vector<checkpoint::ParameterSideState> checkpoint_side_states() { return {}; }
};

}  // namespace loom::train
